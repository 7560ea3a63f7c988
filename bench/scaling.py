"""Sizing on paper: the simulator at 10,000 and 100,000 requests/s (docs/scaling.md).

    python -m bench.scaling [--seconds 20] [--only NAME]

Each scenario is a fleet sized from measured per-process costs (docs/scaling.md says
where each number comes from) under the default tiers (5% enterprise, 25% paid, 70%
free, Poisson, 20 tenants per tier), at the target rate and at three times it. Prints a
markdown table per scenario and writes JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gristmill.simulate.engine import simulate
from gristmill.simulate.scenario import CostCurve, Scenario, Stream, WorkerEvent

MIX = {"enterprise": 0.05, "paid": 0.25, "free": 0.70}
TENANTS = 20
# all-MiniLM-L6-v2 on one H200 through the worker path (docs/bench/gpu.md, mixed 8..128
# tokens): 10.3 ms for 1,024 (99k items/s delivered), launch-bound below 16.
H200_EMBED = CostCurve(((1, 0.3), (16, 0.5), (64, 0.9), (256, 2.7), (1024, 10.3)), 1024)
# `sim` at its defaults: 100 ms per batch of up to 100 (1,000 items/s per worker).
SIM = CostCurve.flat(100.0, 100)
# all-MiniLM-L6-v2 on this machine's CPU, one 2-core worker (bench/embedding.py).
CPU_EMBED = CostCurve(((1, 6.0), (4, 14.3), (16, 62.0), (64, 218.0)), 64)


@dataclass(frozen=True)
class Case:
    name: str
    cost: CostCurve
    workers: int
    schedulers: int
    api_instances: int
    rate: float
    lose: int = 0  # workers lost a third of the way in


CASES = [
    Case("10k-sim", SIM, workers=12, schedulers=6, api_instances=12, rate=10_000),
    Case("10k-h200", H200_EMBED, workers=1, schedulers=1, api_instances=12, rate=10_000),
    Case("100k-sim", SIM, workers=120, schedulers=60, api_instances=120, rate=100_000),
    Case("100k-h200", H200_EMBED, workers=2, schedulers=2, api_instances=120, rate=100_000),
    Case("10k-sim-loss", SIM, workers=12, schedulers=6, api_instances=12, rate=10_000, lose=3),
]


def run(case: Case, factor: float, seconds: float) -> dict[str, Any]:
    total = case.rate * factor
    streams = [
        Stream(tier, f"{tier}-{i}", total * share / TENANTS)
        for tier, share in MIX.items()
        for i in range(TENANTS)
    ]
    events = [WorkerEvent(seconds / 3, i) for i in range(case.lose)]
    sc = Scenario(
        cost=case.cost,
        streams=streams,
        workers=case.workers,
        schedulers=case.schedulers,
        api_instances=case.api_instances,
        # Every scheduler must own partitions of every class: the consumer group gives
        # a scheduler without one nothing to do, while its workers count as capacity.
        partitions=2 * case.schedulers,
        seconds=seconds,
        worker_events=events,
    )
    t0 = time.perf_counter()
    r = simulate(sc)
    wall = time.perf_counter() - t0
    out = r.summary()
    out.pop("tenants")
    out["wall_s"] = round(wall, 1)
    out["factor"] = factor
    out["case"] = case.name
    out["capacity"] = round(sc.usable_capacity())
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| case | offered | capacity | tier | served | refused (reason) | p50 ms | p95 ms | "
        "p99 ms | busy | sim wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        offered = sum(t["offered"] for t in r["tiers"].values()) / r["scenario"]["seconds"]
        for tier, t in r["tiers"].items():
            refused = ", ".join(f"{k} {v:,}" for k, v in t["refused"].items()) or "-"
            lines.append(
                f"| {r['case']} x{r['factor']:g} | {offered:,.0f}/s | {r['capacity']:,}/s | "
                f"{tier} | {t['served_share']:.1%} | {refused} | {t['p50_ms']} | "
                f"{t['p95_ms']} | {t['p99_ms']} | {r['busy']:.1%} | {r['wall_s']} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    ap.add_argument("--factors", default="1,3")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in CASES:
        if args.only and args.only not in case.name:
            continue
        for f in (float(x) for x in args.factors.split(",")):
            row = run(case, f, args.seconds)
            print(table([row]).split("\n", 2)[2], flush=True)
            rows.append(row)
    print(table(rows))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"scaling-{stamp}.json").write_text(json.dumps(rows, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
