"""CPU and size of one scheduler's metrics window for the dashboard (decision 33).

    python -m bench.dashboard_cost [--models 2] [--workers 8]

Fills the scheduler's own registry (scheduler/runtime/metrics.py) as ``--models`` models in every
priority class would (every stage observed, every status counted, ``--workers`` workers
busy), then times ``scheduler.runtime.metrics.window`` - what the scheduler runs once a second -
and prints the JSON size of what it writes to PostgreSQL. No services.
"""

from __future__ import annotations

import argparse
import json
import time

from core.metrics import STAGES
from core.vocab import PRIORITY_CLASSES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=int, default=2)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--calls", type=int, default=500)
    args = ap.parse_args()
    from scheduler.runtime import metrics

    for m in range(args.models):
        for cls_ in PRIORITY_CLASSES:
            for stage in STAGES[:4]:
                for seconds in (0.003, 0.04, 0.15, 0.6, 3.0):
                    metrics.STAGE_SECONDS.labels(stage, f"m{m}", "1", cls_).observe(seconds)
            for status in ("succeeded", "failed", "expired"):
                metrics.FINISHED.labels(f"m{m}", "1", cls_, status).inc(10)
        for reason in ("full", "linger", "deadline"):
            metrics.BATCHES.labels(f"m{m}", "1", reason).inc()
    for w in range(args.workers):
        metrics.WORKER_BUSY.labels(f"host-{w}").inc(1.0)
    compute = metrics.STAGE_SECONDS.labels("compute", "m0", "1", "paid")
    now = time.time()
    for i in range(20):  # a full window first
        compute.observe(0.15)
        window = metrics.window(now + i)
    cpu = time.process_time()
    for i in range(args.calls):
        compute.observe(0.15)
        window = metrics.window(now + 20 + i)
    per_call = (time.process_time() - cpu) / args.calls
    series = sum(len(s.samples) for s in metrics.STAGE_SECONDS.collect())
    print(
        f"{args.models} models x {len(PRIORITY_CLASSES)} classes ({series} stage samples), "
        f"{args.workers} workers: {per_call * 1e3:.2f} ms CPU per window, "
        f"{len(json.dumps(window))} bytes of JSON"
    )


if __name__ == "__main__":
    main()
