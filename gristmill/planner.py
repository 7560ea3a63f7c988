"""Capacity planning: how many workers (GPUs) a target rate needs inside an SLO. Pure.

For a batch size b with measured compute time t(b):
  * one worker's throughput is     X(b) = b / t(b)
  * a request's worst-case latency  W(b) = t(b)          (the batch running when it arrives)
                                          + linger       (waiting for companions)
                                          + t(b)          (its own batch)
                                          + overhead      (ingest, Kafka, persist, respond)
The planner picks the batch size with the highest X(b) among those with W(b) <= SLO,
then needs  N = ceil(rate / (utilization * X(b)))  workers, keeping each at the target
utilization so queues stay short (queueing delay grows sharply past ~80% busy).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Option:
    batch: int
    compute_ms: float
    throughput: float  # items/s per worker
    worst_latency_ms: float
    fits: bool


@dataclass(frozen=True)
class Plan:
    options: list[Option]
    chosen: Option | None
    workers: int | None
    rate: float
    slo_ms: float
    utilization: float


def interpolate(profile: dict[int, float], b: int) -> float:
    sizes = sorted(profile)
    if b <= sizes[0]:
        return profile[sizes[0]]
    if b >= sizes[-1]:
        return profile[sizes[-1]] * b / sizes[-1]  # beyond the measurements: linear
    for lo, hi in itertools.pairwise(sizes):
        if lo <= b <= hi:
            return profile[lo] + (b - lo) / (hi - lo) * (profile[hi] - profile[lo])
    raise AssertionError("unreachable")


def plan(
    *,
    rate: float,
    slo_ms: float,
    profile: dict[int, float],
    max_batch: int,
    utilization: float = 0.75,
    linger_ms: float = 50.0,
    overhead_ms: float = 20.0,
) -> Plan:
    if not profile:
        raise ValueError("the model has no measured profile")
    sizes = sorted({*profile, *[2**k for k in range(int(math.log2(max_batch)) + 1)], max_batch})
    options = []
    for b in (s for s in sizes if 1 <= s <= max_batch):
        t = interpolate(profile, b)
        worst = 2 * t + linger_ms + overhead_ms
        options.append(Option(b, t, b / (t / 1000), worst, worst <= slo_ms))
    fitting = [o for o in options if o.fits]
    chosen = max(fitting, key=lambda o: o.throughput) if fitting else None
    workers = math.ceil(rate / (utilization * chosen.throughput)) if chosen else None
    return Plan(options, chosen, workers, rate, slo_ms, utilization)


def render(p: Plan, model: str) -> str:
    lines = [
        f"Plan for {model}: {p.rate:g} req/s with worst-case latency <= {p.slo_ms:g} ms "
        f"at {p.utilization:.0%} utilization",
        "",
        f"{'batch':>6} {'t(b) ms':>9} {'X(b) items/s':>13} {'W(b) ms':>9}  fits SLO",
    ]
    for o in p.options:
        mark = " <- chosen" if o is p.chosen else ""
        lines.append(
            f"{o.batch:>6} {o.compute_ms:>9.1f} {o.throughput:>13.0f} "
            f"{o.worst_latency_ms:>9.1f}  {'yes' if o.fits else 'no'}{mark}"
        )
    lines.append("")
    if p.chosen is None:
        lines.append(
            "No batch size meets the SLO: even a batch of one takes too long. "
            "Relax the SLO or use a faster model or device."
        )
    else:
        c = p.chosen
        lines.append("W(b) = 2 t(b) + linger + overhead;  X(b) = b / t(b)")
        lines.append(
            f"N = ceil(rate / (utilization x X(b))) = ceil({p.rate:g} / "
            f"({p.utilization:g} x {c.throughput:.0f})) = {p.workers} worker(s)"
        )
    return "\n".join(lines)
