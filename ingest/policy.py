"""Applying the tier policy to a request: rate limits (429) and admission (503).

The decisions themselves are pure (ratelimit.py, admission.py); this module
only picks the tenant's numbers and turns a refusal into the right error and
headers (RateLimit-* as in the IETF RateLimit header fields draft).
"""

from __future__ import annotations

import math
import time

from core.config import Settings
from core.errors import RateLimited, Unavailable
from core.vocab import PRIORITY_CLASSES, TIER_TO_CLASS
from ingest.admission import decide
from ingest.load_watch import LoadWatch
from ingest.ratelimit import TenantLimiter, Verdict
from results.tenants import Tenant


def ratelimit_headers(v: Verdict) -> dict[str, str]:
    return {
        "RateLimit-Limit": str(math.floor(v.limit)),
        "RateLimit-Remaining": str(v.remaining),
        "RateLimit-Reset": str(math.ceil(v.reset_s)),
    }


def check_rate(limiter: TenantLimiter, settings: Settings, tenant: Tenant) -> dict[str, str]:
    """One request against the tenant's requests/s; returns headers for the answer."""
    v = limiter.check(
        tenant.id,
        "requests",
        rate=tenant.rate_rps or settings.tier_rate_rps[tenant.tier],
        burst=tenant.burst or settings.tier_burst[tenant.tier],
        n=1,
        now=time.monotonic(),
    )
    headers = ratelimit_headers(v)
    if not v.allowed:
        raise RateLimited(
            f"rate limit of {v.limit:g} requests/s exceeded for this key",
            retry_after_s=v.retry_after_s,
            headers=headers,
        )
    return headers


def check_job_items(limiter: TenantLimiter, settings: Settings, tenant: Tenant) -> dict[str, str]:
    """May this tenant submit a job now? Refused while a big earlier job's items are
    still being paid off (the bucket is in debt); the items are charged once the
    job is recorded (``charge_job_items``), whatever its size."""
    rate = tenant.job_items_per_s or settings.tier_job_items_per_s[tenant.tier]
    v = limiter.check(
        tenant.id,
        "job_items",
        rate=rate,
        burst=rate * 60,
        n=0,
        now=time.monotonic(),
        allow_debt=True,
    )
    headers = ratelimit_headers(v)
    if not v.allowed:
        raise RateLimited(
            f"job item rate of {rate:g} items/s exceeded; wait before the next job",
            retry_after_s=v.retry_after_s,
            headers=headers,
        )
    return headers


def charge_job_items(
    limiter: TenantLimiter, settings: Settings, tenant: Tenant, items: int
) -> None:
    """Charge an accepted job's items (it was admitted when the bucket had tokens)."""
    rate = tenant.job_items_per_s or settings.tier_job_items_per_s[tenant.tier]
    limiter.check(
        tenant.id,
        "job_items",
        rate=rate,
        burst=rate * 60,
        n=items,
        now=time.monotonic(),
        allow_debt=True,
    )


# Window over which higher classes' arrival rate is measured for admission.
RATE_WINDOW_S = 2.0


def check_admission(load: LoadWatch, settings: Settings, tenant: Tenant, model_ref: str) -> None:
    view = load.view
    cls_ = TIER_TO_CLASS[tenant.tier]
    key = (model_ref, cls_, tenant.id)
    # Admitted since the reports were taken, by this instance and (assuming an even
    # spread) as many again by each other live instance.
    now = time.monotonic()
    n = load.limiter.instances
    admitted = load.recent.since(key, view.as_of) * n if view else 0
    # Higher classes' arrival rate (what this instance admitted over the last seconds).
    rank = PRIORITY_CLASSES.index(cls_)
    higher = sum(
        load.recent.since((model_ref, c), now - RATE_WINDOW_S) for c in PRIORITY_CLASSES[:rank]
    )
    higher_rate = higher * n / RATE_WINDOW_S
    d = decide(
        view,
        model_ref,
        cls_,
        utilization=settings.target_utilization,
        thresholds_ms=settings.shed_delay_ms,
        tenant=tenant.id,
        weight=tenant.weight,
        admitted=admitted,
        age_s=now - view.as_of if view else 0.0,
        higher_rate=higher_rate,
    )
    if not d.admit:
        raise Unavailable(d.reason, retry_after_s=d.retry_after_s, reason="predicted_delay")
    load.recent.add(key, now)
    load.recent.add((model_ref, cls_), now)
