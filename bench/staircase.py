"""Interactive against backfill: sync p95 at several sync rates with a job running, and
the job's rate at each (issue 32 item 2).

    python -m bench.staircase --shape 100:10 --shares 0.1,0.2,0.4,0.6,0.8 --step-s 30

Starts its own system (2 ``sim`` workers of ``--shape``), submits one job big enough to
outlast every step, then per share of capacity (ascending): paid sync traffic, open loop,
for ``--step-s`` seconds with the job running; then the same rates again with no job (the
baseline, in the same run). Per step: the sync answers' p50/p95 and statuses (the
first ``WARM_S`` of a step left out) and the job's items/s over the step (its finished
counts read at both ends). The job is cancelled at the end. JSON and a chart go to
``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from gristmill_client import Client

from bench.quote_accuracy import WARM_S, SyncLoad, items, new_key, started, written

SETTLE_S = 2.0  # between steps: the last step's answers come back


def done(gm: Client, job_id: str) -> int:
    c = gm.job(job_id)["counts"]
    return int(c["succeeded"]) + int(c["failed"])


def step(
    system: Any, key: str, rate: float, seconds: float, gm: Client | None, job_id: str | None
) -> dict[str, Any]:
    n0 = done(gm, job_id) if gm and job_id else 0
    t0 = time.monotonic()
    with SyncLoad(system, key, lambda t: rate) as load:  # WARM_S of it before this returns
        time.sleep(max(0.0, seconds - WARM_S))
    took = time.monotonic() - t0
    n1 = done(gm, job_id) if gm and job_id else 0
    time.sleep(SETTLE_S)
    return {
        "sync_rps": round(rate, 1),
        **load.p95_ms(WARM_S),
        "job_items_s": round((n1 - n0) / took, 1) if job_id else None,
    }


def draw(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, a = plt.subplots(figsize=(8, 4.5))
    xs = [100 * s for s in report["shares"]]
    for rows, label, style in (
        (report["with_job"], "sync p95, job running", "-o"),
        (report["baseline"], "sync p95, no job", "--s"),
    ):
        a.plot(xs, [r["p95_ms"] for r in rows], style, label=label)
    a.axhline(report["slo_ms"], color="red", lw=0.8, ls=":", label="paid SLO")
    a.set(xlabel="sync load, % of capacity", ylabel="sync p95 (ms)")
    b = a.twinx()
    b.bar(xs, [r["job_items_s"] for r in report["with_job"]], width=4, alpha=0.3, color="tab:green")
    b.plot(xs, [report["capacity_rps"] * (1 - s) for s in report["shares"]], ":", color="tab:green")
    b.set_ylabel("job items/s (bars; dotted: capacity less sync)")
    a.legend(fontsize=8, loc="upper left")
    fig.suptitle(
        f"interactive vs backfill: sim {report['shape']}, capacity {report['capacity_rps']:g}/s,"
        f" {report['step_s']:g} s a step {report['note']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shape", default="100:10", help="batch_ms:max_batch of sim")
    ap.add_argument("--shares", default="0.1,0.2,0.4,0.6,0.8", help="sync / capacity, ...")
    ap.add_argument("--step-s", type=float, default=30.0)
    ap.add_argument("--note", default="", help="a label for the chart (e.g. the box)")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    shares = sorted(float(s) for s in args.shares.split(","))
    with ExitStack() as stack:
        system, cap = started(stack, args.shape, "gm-staircase-")
        sync_key = new_key(system, "paid", "stair-sync")
        gm = Client(system.url, new_key(system, "enterprise", "stair-job"), timeout_s=3600)
        # Enough for every step at the whole capacity: it never runs dry mid-staircase.
        n = int(cap * (args.step_s + SETTLE_S + 5) * len(shares)) + 1000
        job = gm.submit_job("sim", items(uuid.uuid4().hex[:6], n))
        time.sleep(WARM_S)  # it is running
        with_job = []
        for s in shares:
            with_job.append(step(system, sync_key, cap * s, args.step_s, gm, job["job_id"]))
            print("job", json.dumps(with_job[-1]), flush=True)
        left = gm.job(job["job_id"])["counts"]
        gm.cancel(job["job_id"])
        time.sleep(5)  # what the scheduler holds of it drains
        baseline = []
        for s in shares:
            baseline.append(step(system, sync_key, cap * s, args.step_s, None, None))
            print("alone", json.dumps(baseline[-1]), flush=True)
        slo_ms = system.settings.tier_slo_ms.get("paid", 2000)
    report = {
        "shape": args.shape,
        "capacity_rps": cap,
        "shares": shares,
        "step_s": args.step_s,
        "slo_ms": slo_ms,
        "job_items": n,
        "job_counts_at_end": left,
        "note": args.note,
        "with_job": with_job,
        "baseline": baseline,
    }
    written(args.out, "staircase", report, draw)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
