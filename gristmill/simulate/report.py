"""What a simulated run produced: per tier and tenant outcomes, latency percentiles,
how busy the workers were, and the checks the admission policy promises."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gristmill.simulate.scenario import TIER_ORDER
from ingest.admission.capacity import ORDER_WINDOW_S

if TYPE_CHECKING:
    from gristmill.simulate.scenario import Scenario, Stream
    from scheduler.core.batcher import Pending

__all__ = ["ORDER_WINDOW_S", "Result", "TierStats", "percentile"]

CAPACITY_REASONS = ("capacity", "order", "buffer")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of ``values``; nan when empty."""
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


@dataclass
class TierStats:
    offered: int = 0
    admitted: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    served: int = 0  # answered 200 before the deadline
    late: int = 0  # computed, answered after the deadline (504)
    expired: int = 0  # dropped unrun by the scheduler at its deadline (504)
    shed: int = 0  # dropped unrun by the scheduler before it (503 + Retry-After)
    latencies_ms: list[float] = field(default_factory=list)
    retry_after_missing: int = 0  # capacity refusals without a Retry-After

    def row(self) -> dict[str, Any]:
        lat = self.latencies_ms
        return {
            "offered": self.offered,
            "admitted": self.admitted,
            "served": self.served,
            "served_share": round(self.served / self.offered, 4) if self.offered else None,
            "late_504": self.late + self.expired,
            "shed_after_admission": self.shed,
            "refused": dict(self.refused),
            "p50_ms": round(percentile(lat, 50), 1),
            "p95_ms": round(percentile(lat, 95), 1),
            "p99_ms": round(percentile(lat, 99), 1),
        }


class Result:
    def __init__(self, sc: Scenario):
        self.sc = sc
        self.tiers: dict[str, TierStats] = {t: TierStats() for t in TIER_ORDER}
        self.tenants: dict[str, TierStats] = defaultdict(TierStats)
        self.order_violations = 0
        self.first_refusal: dict[str, float] = {}  # tier -> first capacity refusal (s)
        self.window = (min(5.0, sc.seconds * 0.2), sc.seconds)  # steady state, for busy
        self.busy_s: dict[int, float] = defaultdict(float)  # worker -> compute s in the window
        self.items_in_window = 0.0
        self.batches = 0
        self.batch_items = 0
        self.lost_workers: list[float] = []
        self._down_since: dict[int, float] = {}  # worker -> lost at (still down)
        self._down_s = 0.0  # worker-seconds down in the window, of workers back since
        # second -> (tier, offered | admitted | refused) -> requests
        self.timeline: dict[int, Counter[tuple[str, str]]] = defaultdict(Counter)
        self.end = 0.0

    # ---- recording ---------------------------------------------------------------------
    def offered(self, s: Stream, now: float) -> None:
        self.tiers[s.tier].offered += 1
        self.tenants[s.tenant].offered += 1
        self.timeline[int(now)][(s.tier, "offered")] += 1

    def refused(self, s: Stream, now: float, reason: str, retry_after_s: float) -> None:
        self.tiers[s.tier].refused[reason] += 1
        self.tenants[s.tenant].refused[reason] += 1
        self.timeline[int(now)][(s.tier, "refused")] += 1
        if reason in CAPACITY_REASONS:
            self.first_refusal.setdefault(s.tier, now)
            if retry_after_s <= 0:
                self.tiers[s.tier].retry_after_missing += 1

    def admitted(self, s: Stream, now: float) -> None:
        self.tiers[s.tier].admitted += 1
        self.tenants[s.tenant].admitted += 1
        self.timeline[int(now)][(s.tier, "admitted")] += 1

    def completed(self, p: Pending, answered: float) -> None:
        tier = self.tiers[p.msg.priority]
        tenant = self.tenants[p.msg.tenant_id]
        if answered > p.msg.deadline:
            tier.late += 1
            tenant.late += 1
            return
        tier.served += 1
        tenant.served += 1
        ms = (answered - p.msg.received_at) * 1000
        tier.latencies_ms.append(ms)
        tenant.latencies_ms.append(ms)

    def expired(self, p: Pending, now: float, *, shed: bool = False) -> None:
        for stats in (self.tiers[p.msg.priority], self.tenants[p.msg.tenant_id]):
            if shed:
                stats.shed += 1
            else:
                stats.expired += 1

    def computed(self, n: int, seconds: float, end: float, worker: int) -> None:
        self.batches += 1
        self.batch_items += n
        lo, hi = self.window
        start = end - seconds
        overlap = max(0.0, min(end, hi) - max(start, lo))
        if overlap > 0:
            self.busy_s[worker] += overlap
            self.items_in_window += n * overlap / seconds if seconds > 0 else n

    def worker_lost(self, now: float, worker: int) -> None:
        self.lost_workers.append(now)
        self._down_since[worker] = now

    def worker_joined(self, now: float, worker: int) -> None:
        since = self._down_since.pop(worker, None)
        if since is not None:
            self._down_s += self._overlap(since, now)

    def _overlap(self, a: float, b: float) -> float:
        lo, hi = self.window
        return max(0.0, min(b, hi) - max(a, lo))

    def finish(self, now: float) -> None:
        self.end = now

    # ---- summaries ---------------------------------------------------------------------
    def busy(self) -> float:
        """Share of the window the live workers spent computing."""
        lo, hi = self.window
        down = self._down_s + sum(self._overlap(t, hi) for t in self._down_since.values())
        total = (hi - lo) * self.sc.workers - down
        return sum(self.busy_s.values()) / total if total > 0 else 0.0

    def capacity_used(self) -> float:
        """Items computed in the window over what the fleet can do at the batch size
        the batch budget allows (the most any admission policy could get out of it)."""
        lo, hi = self.window
        cap = self.sc.usable_capacity() * (hi - lo)
        return self.items_in_window / cap if cap > 0 else 0.0

    def mean_batch(self) -> float:
        return self.batch_items / self.batches if self.batches else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "scenario": self.sc.describe(),
            "tiers": {t: s.row() for t, s in self.tiers.items() if s.offered},
            "tenants": {t: s.row() for t, s in self.tenants.items()},
            "busy": round(self.busy(), 4),
            "capacity_used": round(self.capacity_used(), 4),
            "mean_batch": round(self.mean_batch(), 1),
            "order_violations": self.order_violations,
            "first_refusal_s": {t: round(v, 3) for t, v in self.first_refusal.items()},
        }

    def table(self) -> str:
        lines = [
            f"{'tier':<11}{'offered':>9}{'served':>9}{'share':>7}{'late':>6}{'exp':>6}"
            f"{'refused: reason':>34}{'p50':>8}{'p95':>8}{'p99':>8}",
        ]
        for t in TIER_ORDER:
            s = self.tiers[t]
            if not s.offered:
                continue
            r = s.row()
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(s.refused.items())) or "-"
            lines.append(
                f"{t:<11}{s.offered:>9}{s.served:>9}{r['served_share']:>7.1%}"
                f"{s.late:>6}{s.expired:>6}{reasons:>34}{r['p50_ms']:>8}{r['p95_ms']:>8}{r['p99_ms']:>8}"
            )
        lines.append(
            f"workers busy {self.busy():.1%}, capacity used {self.capacity_used():.1%}, "
            f"mean batch {self.mean_batch():.1f}, order violations {self.order_violations}"
        )
        return "\n".join(lines)
