"""Job items against the tenant's budget: a token bucket per tenant of ``job_items_per_s``
(its plan, else its tier's) holding a minute of it, charged in PostgreSQL.

A job larger than the bucket may drive it into debt while it holds any tokens (it is
not refused forever for its size); the next job waits the debt off. The charge takes
the bucket's row lock in the transaction that records the job, so concurrent
submissions, on any instances, are charged one after another and the second sees
the first's debt. The decision is the pure ``TokenBucket``; this module reads and
writes the bucket through results/job_quota.py.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from core.config import Settings
from core.errors import RateLimited
from ingest.admission.ratelimit import TokenBucket, Verdict
from results.job_quota import Budget, lock_budget, peek_budget, store_budget
from results.tenants import Tenant

# The bucket holds this many seconds of the tenant's item rate.
BURST_S = 60.0


def decide(budget: Budget, rate: float, n: int) -> tuple[Verdict, float]:
    """May ``n`` items be charged? Returns the verdict and the tokens left after it.
    ``budget.age_s`` is the clock: seconds since the tokens were written."""
    burst = rate * BURST_S
    bucket = TokenBucket(rate, burst, now=0.0)
    if budget.tokens is not None:
        bucket.tokens = min(burst, budget.tokens)
    verdict = bucket.take(n, budget.age_s, allow_debt=True)
    return verdict, bucket.tokens


def items_rate(settings: Settings, tenant: Tenant) -> float:
    return tenant.job_items_per_s or settings.tier_job_items_per_s[tenant.tier]


def _refusal(v: Verdict, rate: float) -> RateLimited:
    return RateLimited(
        f"job item budget of {rate:g} items/s is spent by earlier jobs; wait before the next",
        retry_after_s=v.retry_after_s,
    )


async def refuse_if_in_debt(engine: AsyncEngine, settings: Settings, tenant: Tenant) -> None:
    """429 before any of an upload is read, while earlier jobs' debt is unpaid. Only a
    hint (no lock): ``charge`` decides."""
    rate = items_rate(settings, tenant)
    verdict, _ = decide(await peek_budget(engine, tenant.id), rate, 0)
    if not verdict.allowed:
        raise _refusal(verdict, rate)


async def charge(conn: AsyncConnection, settings: Settings, tenant: Tenant, n: int) -> None:
    """Charge ``n`` items in the caller's transaction (the row stays locked until it
    ends: commit with the job, or roll back with it)."""
    rate = items_rate(settings, tenant)
    verdict, left = decide(await lock_budget(conn, tenant.id), rate, n)
    if not verdict.allowed:
        raise _refusal(verdict, rate)
    await store_budget(conn, tenant.id, left)
