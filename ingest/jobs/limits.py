"""The per-tenant limits on the job API's reads and held-open work (decision 26).

Reads (job status, item pages, result streams, cancel, a request or a completion by
id, files, batches, the model catalog) draw on a bucket of their own with the tenant's
request rate: a tenant may poll as fast as it may submit sync requests, and polling
never eats into its inference rate. Uploads and streams hold resources for as long as
the client keeps them open, so they are bounded by count, per tenant and per instance,
across the instance's processes (ingest/admission/shared_slots.py, decision 43).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from core.config import Settings
from core.errors import RateLimited, Unavailable
from ingest.admission.policy import READS, check_rate
from ingest.admission.ratelimit import TenantLimiter
from ingest.admission.shared_slots import SharedSlots
from results.tenants import Tenant

if TYPE_CHECKING:
    from ingest.acceptance.state import AppState

# Retry-After (seconds) when every slot is held: the interval a client polling a job's
# status would wait anyway; a slot frees when an upload or a stream ends.
SLOT_RETRY_AFTER_S = 5.0


def check_reads(limiter: TenantLimiter, settings: Settings, tenant: Tenant) -> dict[str, str]:
    """One read against the tenant's read bucket; returns RateLimit-* headers."""
    return check_rate(limiter, settings, tenant, bucket=READS)


async def catalog_reader(st: AppState, authorization: str | None) -> Tenant | None:
    """Who reads a catalog route (``/v1/models``, ``/v2/models/...``): None without a key
    (it is shown live versions only), else the tenant, within its read rate; a bad key
    is a 401 as anywhere (an empty header is no key)."""
    if not authorization:
        return None
    tenant = await st.auth.authenticate(authorization)
    check_reads(st.limiter, st.settings, tenant)
    return tenant


def acquire(slots: SharedSlots, tenant_id: str, what: str, per_key: int | None = None) -> None:
    """Take a slot or raise: 429 when the tenant holds its share (``per_key``, else the
    slots' own), 503 when the instance is full."""
    refused = slots.try_acquire(tenant_id, per_key)
    if refused == "tenant":
        raise RateLimited(
            f"this key already has {per_key or slots.per_key} {what} open on this API "
            "instance; finish one first",
            retry_after_s=SLOT_RETRY_AFTER_S,
        )
    if refused == "instance":
        raise Unavailable(
            f"this API instance has {slots.total} {what} open; retry shortly",
            retry_after_s=SLOT_RETRY_AFTER_S,
        )


@contextlib.asynccontextmanager
async def slot(slots: SharedSlots, tenant_id: str, what: str) -> AsyncIterator[None]:
    acquire(slots, tenant_id, what)
    try:
        yield
    finally:
        slots.release(tenant_id)


def hold_stream(st: AppState, tenant: Tenant) -> Callable[[], None]:
    """A slot for one streamed answer (the tier's share of the instance's streams), or
    429/503; returns what gives it back (once)."""
    acquire(st.read_streams, tenant.id, "streams", st.settings.tier_max_streams[tenant.tier])
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            st.read_streams.release(tenant.id)

    return release


class HeldStream(StreamingResponse):
    """A streamed answer that gives its slot back however the stream ends (finished,
    client gone, server stopping)."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        release: Callable[[], None],
        media_type: str = "application/x-ndjson",
        headers: dict[str, str] | None = None,
    ):
        super().__init__(content, media_type=media_type, headers=headers)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()
