"""What a simulated run is: the model's cost, the fleet, the traffic, the faults.

Everything is plain data, so a scenario can be written by hand (the CLI, the
benchmarks' twins), drawn at random (the property tests) or loaded from JSON.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

TIER_ORDER = ("enterprise", "paid", "free")  # most urgent first, as the classes


@dataclass(frozen=True)
class CostCurve:
    """Compute time by batch size: ``points`` (size -> ms) interpolated linearly, flat
    below the first point, proportional past the last; ``cap`` the worker's largest
    batch. ``jitter`` spreads each batch's time (a lognormal factor with this sigma).
    ``warmup_factor`` scales what the worker's warm-up reports above 1 item (a slow
    warm-up taken while the host was busy), to show the online curve correcting it."""

    points: tuple[tuple[int, float], ...]
    cap: int
    jitter: float = 0.0
    warmup_factor: float = 1.0

    @classmethod
    def flat(cls, ms: float, cap: int, jitter: float = 0.0) -> CostCurve:
        """``sim``: the same time whatever the size."""
        return cls(((1, ms), (cap, ms)), cap, jitter)

    @classmethod
    def linear(
        cls, fixed_ms: float, per_item_ms: float, cap: int, jitter: float = 0.0
    ) -> CostCurve:
        """A fixed cost per batch plus a cost per item (a CPU model)."""
        return cls(((1, fixed_ms + per_item_ms), (cap, fixed_ms + per_item_ms * cap)), cap, jitter)

    def ms(self, n: int) -> float:
        sizes = [s for s, _ in self.points]
        i = bisect.bisect_left(sizes, n)
        if i < len(sizes) and sizes[i] == n:
            return self.points[i][1]
        if i == 0:
            return self.points[0][1]
        if i == len(sizes):
            s, ms = self.points[-1]
            return ms * n / s
        (lo, a), (hi, b) = self.points[i - 1], self.points[i]
        return a + (n - lo) / (hi - lo) * (b - a)

    def warmup_profile(self) -> dict[int, float]:
        """What a worker reports at start: powers of two up to the cap, and the cap."""
        powers = (1 << k for k in range(self.cap.bit_length()) if 1 << k <= self.cap)
        sizes = sorted({*powers, self.cap})
        return {n: self.ms(n) * (self.warmup_factor if n > 1 else 1.0) for n in sizes}

    def throughput(self) -> float:
        """Best items/s of one worker, over all sizes (the raw ceiling)."""
        return max(n / (self.ms(n) / 1000) for n in range(1, self.cap + 1))


@dataclass(frozen=True)
class Stream:
    """One tenant's traffic: Poisson at ``rate`` req/s over [start_s, end_s), or with
    ``count`` set, a burst of that many requests sent evenly at ``rate`` from start_s."""

    tier: str
    tenant: str
    rate: float
    start_s: float = 0.0
    end_s: float = math.inf
    count: int | None = None
    timeout_ms: float | None = None  # the caller's deadline; None: the tier's SLO
    weight: float = 1.0
    rate_limit: tuple[float, float] | None = None  # (req/s, burst); None: not limited
    # Poisson streams only: requests come in clumps of this many at once (the clumps
    # are Poisson at rate / clump), as a congested client or load balancer sends them.
    clump: int = 1


@dataclass(frozen=True)
class WorkerEvent:
    at_s: float
    worker: int  # index into the fleet
    kind: str = "loss"  # loss | join


@dataclass
class Overheads:
    """The real path's costs outside the model (ms), measured on this machine."""

    kafka_ms: float = 6.0  # produce acknowledged -> read by the scheduler
    persist_ms: float = 3.0  # batch result -> rows committed
    answer_ms: float = 3.0  # commit -> the API's answer leaves
    dispatch_gap_ms: float = 1.5  # a worker's idle gap between batches (unpipelined)
    report_s: float = 0.25  # schedulers' load report period
    refresh_s: float = 0.25  # API instances' view refresh period


@dataclass
class Scenario:
    cost: CostCurve
    streams: list[Stream]
    workers: int = 2
    schedulers: int = 1
    api_instances: int = 1
    seconds: float = 60.0
    slo_ms: dict[str, float] = field(
        default_factory=lambda: {"enterprise": 1000.0, "paid": 2000.0, "free": 5000.0}
    )
    linger_ms: float = 50.0
    margin_ms: float = 20.0
    max_buffered: int = 20_000
    partitions: int = 6  # per class topic
    key_by_tenant: bool = False  # partition keying (default: keyless, sticky)
    worker_events: list[WorkerEvent] = field(default_factory=list)
    overheads: Overheads = field(default_factory=Overheads)
    seed: int = 1
    dispatch: str = "core"  # which dispatch core drives the workers (simulate/dispatch.py)

    def capacity(self) -> float:
        """Items/s of the whole fleet at the best batch size (the raw ceiling)."""
        return self.workers * self.cost.throughput()

    def batch_budgets_ms(self) -> tuple[float, ...]:
        """Per tier SLO, tightest first, as Settings.batch_budgets."""
        return tuple(
            max(1.0, (slo - self.linger_ms - self.margin_ms) / 2)
            for slo in sorted(self.slo_ms.values())
        )

    def batch_size(self) -> int:
        """The batch size the cost model settles on for the true curve: the most items/s
        within the tightest budget a batch of one fits (scheduler/core/costmodel.py)."""
        c = self.cost
        fitting = [b for b in self.batch_budgets_ms() if c.ms(1) <= b]
        limit = fitting[0] if fitting else c.ms(1) / 0.95
        rates = {n: n / c.ms(n) for n in range(1, c.cap + 1) if c.ms(n) <= limit}
        best = max(rates.values())
        return max(n for n, r in rates.items() if r >= 0.95 * best)

    def usable_capacity(self) -> float:
        """Items/s of the whole fleet at that batch size: what admission can fill."""
        n = self.batch_size()
        return self.workers * n / (self.cost.ms(n) / 1000)

    def describe(self) -> dict[str, Any]:
        return {
            "cost": {"points": self.cost.points, "cap": self.cost.cap, "jitter": self.cost.jitter},
            "workers": self.workers,
            "schedulers": self.schedulers,
            "api_instances": self.api_instances,
            "seconds": self.seconds,
            "streams": [s.__dict__ for s in self.streams],
            "capacity_items_s": round(self.capacity(), 1),
        }
