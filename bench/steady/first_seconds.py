"""A fresh system's first seconds, stage by stage (issue 30 item 4).

Starts a system as the soak does (bench/steady/rig.py), sends ``--rate`` sync requests/s
for ``--seconds`` with a job of ``--job-items`` submitted with the first request, and
before tearing it down reads the request log: for each second of receipt, the sync
requests' p95 in each stage (produce, consume, batch wait, the worker's start, compute,
the store) and end to end, next to what the clients saw (outcomes and latency per 10 s).
The soak says *that* a start was slow; this says *where*.

    .venv/bin/python -m bench.steady.first_seconds --rate 900 --seconds 25 --job-items 60000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg

from bench.steady import rig
from bench.steady.report import window_rows
from bench.steady.soak import Jobs
from bench.steady.traffic import TrafficSpec, run_traffic

_P95 = "percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM {}) * 1000)"
STAGES = {
    "produce": "produced_at - received_at",
    "consume": "consumed_at - produced_at",
    "batch_wait": "batched_at - consumed_at",
    "start": "compute_start_at - batched_at",
    "compute": "compute_end_at - compute_start_at",
    "store": "persisted_at - compute_end_at",
    "total": "persisted_at - received_at",
}
BY_SECOND = (
    "SELECT floor(extract(epoch FROM received_at) - %(t0)s)::int AS s, count(*) AS n, "
    + ", ".join(f"{_P95.format(expr)} AS {name}" for name, expr in STAGES.items())
    + " FROM requests WHERE job_id IS NULL AND received_at >= to_timestamp(%(t0)s)"
    " GROUP BY 1 ORDER BY 1"
)


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gm-first-") as tmp:
        work = Path(tmp)
        with rig.dev_like_system(prefix="gm-first-", keep=work / "logs") as system:
            spec = TrafficSpec(
                url=system.url,
                key=system.keys["enterprise"],
                rate=args.rate,
                duration_s=args.seconds,
                tag=rig.new_tag(),
            )
            jobs = Jobs(system, args.job_items, 3600, work) if args.job_items > 0 else None
            if jobs is not None:
                jobs.start()
            traffic = run_traffic(spec, processes=args.clients)
            if jobs is not None:
                jobs.finish(args.job_wait_s)
            with psycopg.connect(rig.dsn(system)) as conn:
                cur = conn.execute(BY_SECOND, {"t0": traffic.start_wall})
                names = [d.name for d in cur.description or []]
                rows = [
                    {
                        k: round(v, 1) if isinstance(v, float) else v
                        for k, v in zip(names, r, strict=True)
                    }
                    for r in cur.fetchall()
                ]
    return {
        "rate": args.rate,
        "seconds": args.seconds,
        "job_items": args.job_items,
        "stages_p95_ms_by_second": rows,
        "outcomes_by_second": [dict(c) for c in traffic.seconds],
        "windows": window_rows(traffic),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rate", type=float, default=900)
    ap.add_argument("--seconds", type=float, default=25)
    ap.add_argument("--job-items", type=int, default=60_000)
    ap.add_argument("--job-wait-s", type=float, default=300)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    report = run(args)
    cols = ["s", "n", *STAGES]
    print(" ".join(f"{c:>10}" for c in cols))
    for r in report["stages_p95_ms_by_second"]:
        print(" ".join(f"{r[c] if r[c] is not None else '-':>10}" for c in cols))
    print(json.dumps(report["windows"]))
    refused = [(i, c) for i, c in enumerate(report["outcomes_by_second"]) if set(c) - {"200"}]
    print("refused or failed, by second:", refused or "none")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "first-seconds.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
