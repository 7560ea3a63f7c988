"""The per-tenant limits on the job API's reads and held-open work (decision 26).

Reads (job status, item pages, result streams, cancel) draw on a bucket of their
own with the tenant's request rate: a tenant may poll as fast as it may submit
sync requests, and polling never eats into its inference rate. Uploads and
``follow=true`` streams hold resources for as long as the client keeps them open,
so they are bounded by count, per tenant and per instance (ingest/admission/ratelimit.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from core.config import Settings
from core.errors import RateLimited, Unavailable
from ingest.admission.policy import READS, check_rate
from ingest.admission.ratelimit import SlotLimiter, TenantLimiter
from results.tenants import Tenant

# Retry-After (seconds) when every slot is held: the interval a client polling a job's
# status would wait anyway; a slot frees when an upload or a stream ends.
SLOT_RETRY_AFTER_S = 5.0


def check_reads(limiter: TenantLimiter, settings: Settings, tenant: Tenant) -> dict[str, str]:
    """One read against the tenant's read bucket; returns RateLimit-* headers."""
    return check_rate(limiter, settings, tenant, bucket=READS)


def acquire(slots: SlotLimiter, tenant_id: str, what: str) -> None:
    """Take a slot or raise: 429 when the tenant holds its share, 503 when the
    instance is full."""
    refused = slots.try_acquire(tenant_id)
    if refused == "tenant":
        raise RateLimited(
            f"this key already has {slots.per_key} {what} open; finish one first",
            retry_after_s=SLOT_RETRY_AFTER_S,
        )
    if refused == "instance":
        raise Unavailable(
            f"this API instance has {slots.total} {what} open; retry shortly",
            retry_after_s=SLOT_RETRY_AFTER_S,
        )


@contextlib.asynccontextmanager
async def slot(slots: SlotLimiter, tenant_id: str, what: str) -> AsyncIterator[None]:
    acquire(slots, tenant_id, what)
    try:
        yield
    finally:
        slots.release(tenant_id)
