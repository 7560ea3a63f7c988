"""A noisy and a quiet tenant of the same tier: does one's burst hurt the other?

    python -m bench.fairness --burst 50000 --noisy-rate 1000 --quiet-rate 20

Starts its own system with `sim` shrunk to batches of 10 (2 workers x 10 items per
100 ms = 200 items/s, as in bench.overload, so this 2-core machine can offer several
times capacity). Two paid tenants, both with rate limits raised out of the way so
what protects the quiet one is admission and the scheduler's round robin, not a
per-tenant rate limit:

1. the quiet tenant alone, at ``--quiet-rate`` for ``--quiet-seconds``;
2. the same again while the noisy tenant fires a burst of ``--burst`` requests at
   ``--noisy-rate`` (open loop).

Prints and saves (JSON + PNG) the quiet tenant's latency alone and during the burst
against the paid SLO, the noisy tenant's outcomes (served, 503 with Retry-After,
504), and checks that every accepted request was persisted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from bench.openloop import RunResult, run_open_loop
from bench.stages import stage_percentiles
from bench.system import sim_system
from gristmill.devservices.stack import System
from results.db import make_engine
from results.schema import requests
from results.tenants import create_tenant, issue_key, set_plan

CAPACITY = 2 * 10 / 0.100


def paid_tenant(system: System, label: str) -> tuple[str, str]:
    with make_engine(system.settings.database_url).begin() as conn:
        name = f"fair-{label}-{uuid.uuid4().hex[:6]}"
        t = create_tenant(conn, name, "paid")
        set_plan(conn, name, rate_rps=1e6, burst=1e6)
        return t.id, issue_key(conn, t)[1]


def load(system: System, key: str, rate: float, count: int, tag: str) -> Any:
    return run_open_loop(
        url=f"{system.url}/v1/infer",
        headers={"Authorization": f"Bearer {key}"},
        rate=rate,
        count=count,
        timeout_s=60,
        make_body=lambda i: {"model": "sim", "input": f"{tag}-{i}"},
    )


def outcome(r: RunResult, slo_ms: float) -> dict[str, Any]:
    ok = [s.latency_ms for s in r.ok]
    return {
        **r.outcomes(),
        "offered_rps": r.rate,
        "max_ms": round(max(ok), 1) if ok else None,
        "within_slo": sum(x <= slo_ms for x in ok) / len(ok) if ok else None,
        # why requests were refused, by message (numbers stripped, so reasons group)
        "refusals": dict(
            Counter(
                re.sub(r"[0-9.]+", "N", s.error or "") for s in r.samples if s.status != 200
            ).most_common(5)
        ),
    }


def persisted(system: System, tenant_id: str) -> int:
    with make_engine(system.settings.database_url).connect() as conn:
        return int(
            conn.execute(
                select(func.count()).select_from(requests).where(requests.c.tenant_id == tenant_id)
            ).scalar_one()
        )


def draw(report: dict[str, Any], quiet: RunResult, noisy: RunResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.2))
    for r, label, color in ((noisy, "noisy", "tab:red"), (quiet, "quiet", "tab:blue")):
        pts = [(s.intended, s.latency_ms) for s in r.samples if s.status == 200]
        a.scatter([p[0] for p in pts], [p[1] for p in pts], s=3, label=f"{label} (200)", c=color)
        shed = [s.intended for s in r.samples if s.status == 503]
        if shed and label == "noisy":
            a.hist(
                shed,
                bins=50,
                weights=[5] * len(shed),
                alpha=0.15,
                color=color,
                label="noisy 503s (x5 per bin)",
            )
    a.axhline(report["slo_ms"], color="k", ls="--", lw=1, label="paid SLO")
    a.set(title="latency of served requests during the burst", xlabel="s", ylabel="ms")
    a.legend(fontsize=8)
    labels = ["quiet alone", "quiet with burst", "noisy"]
    rows = [report["quiet_alone"], report["quiet_with_burst"], report["noisy"]]
    for q, marker in (("p50_ms", "o"), ("p95_ms", "s"), ("p99_ms", "^")):
        b.plot(labels, [r[q] for r in rows], marker=marker, ls="", label=q)
    b.axhline(report["slo_ms"], color="k", ls="--", lw=1)
    b.set(title="percentiles of served requests", ylabel="ms", yscale="log")
    b.legend(fontsize=8)
    b.grid(alpha=0.3)
    fig.suptitle(
        f"noisy burst of {report['burst']:,} at {report['noisy_rate']:g}/s vs a quiet tenant at "
        f"{report['quiet_rate']:g}/s (same tier, capacity {CAPACITY:g}/s)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--burst", type=int, default=50_000, help="noisy tenant's requests")
    ap.add_argument("--noisy-rate", type=float, default=500.0)
    ap.add_argument("--quiet-rate", type=float, default=20.0)
    ap.add_argument("--quiet-seconds", type=float, default=20.0, help="of the baseline")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        system = sim_system(stack, "gm-fair-", extra_env={"GRISTMILL_SIM_MAX_BATCH": "10"})
        slo_ms = float(system.settings.tier_slo_ms["paid"])
        quiet_id, quiet_key = paid_tenant(system, "quiet")
        noisy_id, noisy_key = paid_tenant(system, "noisy")
        time.sleep(2)  # load reports reach the API
        n_alone = int(args.quiet_rate * args.quiet_seconds)
        print(f"quiet tenant alone: {args.quiet_rate:g}/s for {args.quiet_seconds:g}s ...")
        a0 = time.time()
        alone = asyncio.run(load(system, quiet_key, args.quiet_rate, n_alone, "alone"))
        a1 = time.time()
        burst_s = args.burst / args.noisy_rate
        n_quiet = int(args.quiet_rate * burst_s)
        print(f"burst: {args.burst:,} noisy requests at {args.noisy_rate:g}/s ({burst_s:.0f}s) ...")

        async def both() -> tuple[RunResult, RunResult]:
            q, n = await asyncio.gather(
                load(system, quiet_key, args.quiet_rate, n_quiet, "quiet"),
                load(system, noisy_key, args.noisy_rate, args.burst, "noisy"),
            )
            return q, n

        b0 = time.time()
        quiet, noisy = asyncio.run(both())
        b1 = time.time()
        time.sleep(5)  # let anything accepted but late finish
        stored = {"quiet": persisted(system, quiet_id), "noisy": persisted(system, noisy_id)}
        stages = {
            "quiet_alone": stage_percentiles(system, a0, a1, tenant_id=quiet_id),
            "quiet_with_burst": stage_percentiles(system, b0, b1, tenant_id=quiet_id),
            "noisy": stage_percentiles(system, b0, b1, tenant_id=noisy_id),
        }
    report: dict[str, Any] = {
        "capacity_rps": CAPACITY,
        "slo_ms": slo_ms,
        "burst": args.burst,
        "noisy_rate": args.noisy_rate,
        "quiet_rate": args.quiet_rate,
        "quiet_alone": outcome(alone, slo_ms),
        "quiet_with_burst": outcome(quiet, slo_ms),
        "noisy": outcome(noisy, slo_ms),
    }
    # Accepted = 200 or 504 (504 is accepted, merely late): every one must be persisted.
    accepted = {
        "quiet": sum(s.status in (200, 504) for s in [*alone.samples, *quiet.samples]),
        "noisy": sum(s.status in (200, 504) for s in noisy.samples),
    }
    report["lost"] = {k: max(0, accepted[k] - stored[k]) for k in accepted}
    report["stages"] = stages
    report["p95_ratio_quiet"] = round(
        report["quiet_with_burst"]["p95_ms"] / report["quiet_alone"]["p95_ms"], 3
    )
    print(json.dumps(report, indent=2))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"fairness-{stamp}.json").write_text(json.dumps(report, indent=2))
    draw(report, quiet, noisy, args.out / f"fairness-{stamp}.png")
    print(f"wrote {args.out}/fairness-{stamp}.json and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
