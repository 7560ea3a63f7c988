"""CPU cost of the metric hooks per request, in isolation (no services).

    python -m bench.metrics_cost

Runs exactly the calls the request path makes: in an API process in multiprocess mode
(the tier, admitted, the produce latency, the answer's two histograms, the response
counter) and in the scheduler per batch of ``--batch`` (the batch's counters and one
``persisted`` over its rows). The end-to-end comparison (bench.profile, main against
this code) is noisier than the cost itself on a shared machine; this gives the number
the hooks add, to set against bench.profile's CPU per request.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime


def api_cost(n: int) -> float:
    """Seconds of CPU per request for the API's hooks (multiprocess mode)."""
    from core.messages import RequestMessage
    from core.vocab import RequestStatus
    from ingest import metrics

    now = time.time()
    msg = RequestMessage("r", "t", "paid", "sim", "1", "x", {}, now + 2, now - 0.15)
    row = {"status": RequestStatus.SUCCEEDED, "persisted_at": datetime.fromtimestamp(now, UTC)}
    t0 = time.process_time()
    for _ in range(n):
        metrics.request_tier.set("paid")
        metrics.admitted("paid")
        metrics.produced(0.004)
        metrics.answered(msg, row, now + 0.003)
        metrics.responded(200, None)
    return (time.process_time() - t0) / n


def scheduler_cost(batches: int, size: int) -> float:
    """Seconds of CPU per request for the scheduler's hooks."""
    from core.messages import RequestMessage
    from core.protocol import WorkResult
    from scheduler.core.batcher import Batch, BatchKey, FlushReason, Pending
    from scheduler.runtime import metrics
    from scheduler.runtime.rows import succeeded_rows

    t = time.time()
    items = [
        Pending(
            RequestMessage(f"r{i}", "t", "paid", "sim", "1", "x", {}, t + 2, t - 0.1 + i * 1e-4),
            BatchKey("sim", "1"),
            1,
            ("topic", 0),
            i,
            t - 0.05,
        )
        for i in range(size)
    ]
    batch = Batch(BatchKey("sim", "1"), items, formed_at=t - 0.04, reason=FlushReason.LINGER)
    rows = succeeded_rows(batch, ["o"] * size, t - 0.03, t - 0.01)
    result = WorkResult(batch.batch_id, ["o"] * size, None, t - 0.03, t - 0.01)
    max_batch = {batch.key.ref: 100}
    t0 = time.process_time()
    for _ in range(batches):
        metrics.batch_done("w0", batch, result, max_batch)
        metrics.persisted(rows, now=t)
    return (time.process_time() - t0) / (batches * size)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=50, help="requests per batch (1,000 req/s: ~50)")
    ap.add_argument("--part", choices=["api", "scheduler"], help="one part, in this process")
    args = ap.parse_args(argv)
    if args.part == "api":
        print(api_cost(args.requests))
        return 0
    if args.part == "scheduler":
        print(scheduler_cost(args.requests // args.batch, args.batch))
        return 0
    # Each part in a process of its own, as they run: the API in multiprocess mode (the
    # directory set before the client loads), the scheduler in single-process mode.
    base = [sys.executable, "-m", "bench.metrics_cost", "--requests", str(args.requests)]
    with tempfile.TemporaryDirectory(prefix="gm-cost-") as d:
        api_env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": d}
        api = float(subprocess.check_output([*base, "--part", "api"], env=api_env, text=True))
    sched_env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    sched = float(
        subprocess.check_output(
            [*base, "--batch", str(args.batch), "--part", "scheduler"], env=sched_env, text=True
        )
    )
    print(
        f"API hooks {api * 1e6:.1f} us/request (multiprocess mode), scheduler hooks "
        f"{sched * 1e6:.1f} us/request (batches of {args.batch}); "
        f"together {(api + sched) * 1e6:.1f} us/request"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
