"""Per-tenant rate limits: token buckets. Pure, apart from the clock you pass in.

Limits are global per tenant but enforced locally by each API instance: every
instance knows how many instances are alive (they heartbeat into PostgreSQL) and
gives each tenant 1/N of the tier's rate and burst. Behind a load balancer that
spreads requests evenly, the sum holds the global limit with no per-request
round trip. See docs/decisions/0007-rate-limits-without-a-round-trip.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Verdict:
    allowed: bool
    limit: float  # requests (or items) per second for this tenant, this instance
    remaining: int  # whole tokens left after this call
    reset_s: float  # seconds until the bucket is full again
    retry_after_s: float  # 0 when allowed


class TokenBucket:
    def __init__(self, rate: float, burst: float, now: float):
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def _refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def take(self, n: float, now: float, *, allow_debt: bool = False) -> Verdict:
        """Take ``n`` tokens. With ``allow_debt`` (job submissions) a big request may
        drive the bucket negative while it has any tokens: it is not refused
        forever for being larger than the burst; the next one waits the debt off."""
        self._refill(now)
        ok = (
            (self.tokens > 0 or (n == 0 and self.tokens >= 0)) if allow_debt else (self.tokens >= n)
        )
        if ok:
            self.tokens -= n
        # time until the bucket holds enough: n tokens, or (in debt mode) is out of debt
        missing = 0.0 if ok else (-self.tokens if allow_debt else n - self.tokens)
        return Verdict(
            allowed=ok,
            limit=self.rate,
            remaining=max(0, math.floor(self.tokens)),
            reset_s=max(0.0, (self.burst - self.tokens) / self.rate) if self.rate else 0.0,
            retry_after_s=0.0 if ok else (missing / self.rate if self.rate else 60.0),
        )


class TenantLimiter:
    """One bucket per (tenant, kind); rates scale with the number of live instances."""

    def __init__(self) -> None:
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self.instances = 1

    def check(
        self,
        tenant: str,
        kind: str,
        *,
        rate: float,
        burst: float,
        n: float,
        now: float,
        allow_debt: bool = False,
    ) -> Verdict:
        share = 1.0 / max(1, self.instances)
        r, b = rate * share, max(1.0, burst * share)
        bucket = self._buckets.get((tenant, kind))
        if bucket is None:
            bucket = self._buckets[(tenant, kind)] = TokenBucket(r, b, now)
        elif bucket.rate != r or bucket.burst != b:  # instance count or plan changed
            bucket.rate, bucket.burst = r, b
            bucket.tokens = min(bucket.tokens, b)
        return bucket.take(n, now, allow_debt=allow_debt)


class InflightLimiter:
    """Bounds the requests one API instance holds at once, lowest tier first.

    The instance's own CPU and memory are finite: past its capacity, queueing more
    requests only makes every one of them late. Each tier may fill a share of the
    slots (free the smallest), so the instance turns away free traffic while it
    still has room for enterprise traffic. Refusing is cheap: a 503 before any
    parsing, Kafka or database work.
    """

    def __init__(self, max_inflight: int, shares: dict[str, float]):
        self.max_inflight = max_inflight
        self.shares = shares
        self.inflight = 0

    def try_acquire(self, tier: str) -> bool:
        if self.inflight >= self.max_inflight * self.shares.get(tier, 1.0):
            return False
        self.inflight += 1
        return True

    def release(self) -> None:
        self.inflight -= 1
