"""What each tenant of a tier was entitled to, what it received, in device seconds. Pure.

After a batch runs, its measured compute is split over its items in proportion to
their estimates (scheduler/core/itemcost.py): what each tenant *received*. The same
seconds are owed, per tier, to the tenants that were backlogged in the batch's queue
when it was formed, in proportion to their weights: what each was *entitled* to
(weight / sum of the backlogged weights; a tenant with nothing queued is owed nothing,
as deficit round robin banks an idle tenant no credit).

Both are kept twice: running totals (Prometheus counters; rates over any window come
from them) and sums decayed with a half-life of ``HALF_LIFE_S`` (the shares and the
fairness index a scrape shows now). Jain's index per tier is taken over each recent
tenant's received / entitled: 1 when every tenant got what it was owed, 1/n when one
of n got it all. The clock is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

# The recent window's half-life: a minute, the span a tenant watching its dashboard
# judges by, and long enough that a 100 ms batch cadence averages out.
HALF_LIFE_S = 60.0
_TAU = HALF_LIFE_S / math.log(2)
# A tenant whose recent entitled and received seconds both decayed below this share of
# the tier's is no longer shown in the recent shares (its totals stay).
FORGOTTEN = 1e-4
# Rebase the decay's reference time before its growth factor overflows (~e^50).
_REBASE_S = 50 * _TAU


@dataclass
class _Account:
    received_s: float = 0.0  # totals
    entitled_s: float = 0.0
    # Recent sums, stored scaled by exp((t - ref) / tau) at the time t they were added,
    # so adding is O(1) and decay is applied only when read.
    received_scaled: float = 0.0
    entitled_scaled: float = 0.0


@dataclass(frozen=True, slots=True)
class TenantShare:
    tier: str
    tenant: str
    received_s: float  # device seconds received (total)
    entitled_s: float  # device seconds it was owed (total)
    received_share: float  # of the tier's recent device time
    entitled_share: float


@dataclass(frozen=True, slots=True)
class FairnessStats:
    tenants: tuple[TenantShare, ...] = ()
    index: Mapping[str, float] = field(default_factory=dict)  # tier -> Jain's index (recent)


def jain(xs: list[float]) -> float:
    """Jain's fairness index of ``xs`` (1 for none)."""
    s, sq = math.fsum(xs), math.fsum(x * x for x in xs)
    return 1.0 if not xs or sq == 0 else s * s / (len(xs) * sq)


def entitled(seconds: float, backlog: Mapping[str, float]) -> dict[str, float]:
    """``seconds`` owed to the backlogged tenants in proportion to their weights."""
    total = math.fsum(backlog.values())
    if total <= 0:
        return {}
    return {t: seconds * w / total for t, w in backlog.items()}


class Shares:
    def __init__(self, start: float = 0.0) -> None:
        self._ref = start
        self._tiers: dict[str, dict[str, _Account]] = {}

    def charge(
        self,
        now: float,
        tier: str,
        received: Mapping[str, float],
        backlog: Mapping[str, float],
    ) -> None:
        """A batch's seconds in ``tier``: ``received`` per tenant, owed to ``backlog``
        (tenant -> weight)."""
        if now - self._ref > _REBASE_S:
            self._rebase(now)
        grow = math.exp((now - self._ref) / _TAU)
        accounts = self._tiers.setdefault(tier, {})
        for tenant, s in received.items():
            a = accounts.setdefault(tenant, _Account())
            a.received_s += s
            a.received_scaled += s * grow
        for tenant, s in entitled(math.fsum(received.values()), backlog).items():
            a = accounts.setdefault(tenant, _Account())
            a.entitled_s += s
            a.entitled_scaled += s * grow

    def _rebase(self, now: float) -> None:
        shrink = math.exp(-(now - self._ref) / _TAU)
        for accounts in self._tiers.values():
            for a in accounts.values():
                a.received_scaled *= shrink
                a.entitled_scaled *= shrink
        self._ref = now

    def snapshot(self) -> FairnessStats:
        """Totals per tenant, recent shares and each tier's index (the decay's scale
        cancels in shares and ratios, so no clock is needed to read them)."""
        rows: list[TenantShare] = []
        index: dict[str, float] = {}
        for tier, accounts in sorted(self._tiers.items()):
            rec = math.fsum(a.received_scaled for a in accounts.values())
            ent = math.fsum(a.entitled_scaled for a in accounts.values())
            ratios: list[float] = []
            for tenant, a in sorted(accounts.items()):
                r = a.received_scaled / rec if rec > 0 else 0.0
                e = a.entitled_scaled / ent if ent > 0 else 0.0
                rows.append(TenantShare(tier, tenant, a.received_s, a.entitled_s, r, e))
                if e > FORGOTTEN or r > FORGOTTEN:
                    ratios.append(r / e if e > 0 else math.inf)
            finite = [x for x in ratios if math.isfinite(x)]
            index[tier] = jain(finite) if len(finite) == len(ratios) else 0.0
        return FairnessStats(tuple(rows), index)
