"""The dispatch core's CPU per request, in isolation (no threads, no services).

    python -m bench.dispatch_core                      # this tree
    python -m bench.dispatch_core --baseline main      # main and this tree, alternating

One round drives one ``DispatchCore`` on a virtual clock the way the scheduler's threads
do: requests arrive open-loop at ``--rate`` per second (tenants and classes mixed, a
fifth of them job items) and a lane hands over what arrived at least every ``--fetch``
arrivals' time; every worker asks for its next step, each batch comes back after its
predicted compute time, its writes are reported durable, and the offsets are committed
every 100 ms. The CPU time of that loop (process time: other work on a shared machine
does not count) over the requests it served is the core's cost per request; the
harness's own share (building results) is small and the same in both trees.

``--baseline REV`` checks REV out in a temporary git worktree and runs this module there
and here alternately (each first every other round), each round in a fresh process, so
both trees see the same machine state; it prints the median, the fastest and the
slowest round of each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TENANTS = 20
BATCH = 64  # the worker's largest batch
BATCH_MS = (2.0, 8.0)  # compute of a batch of one, of a full batch (virtual ms)


def one_round(n: int, *, rate: float, fetch: int, workers: int, seed: int) -> dict[str, Any]:
    """Serve ``n`` requests; the core's CPU time per request (µs)."""
    import random

    from core.messages import RequestMessage
    from core.protocol import ModelInfo, WorkResult
    from core.vocab import PRIORITY_CLASSES, PriorityClass
    from scheduler.core.backpressure import BufferBudget
    from scheduler.core.batcher import BatchKey, FlushPolicy, Pending
    from scheduler.core.dispatch import DispatchCore

    rng = random.Random(seed)
    core = DispatchCore(
        flush=FlushPolicy(max_linger_s=0.005, margin_s=0.020),
        batch_budget_ms=[50.0, 100.0, 200.0, 1000.0],
        budget=BufferBudget.default(100_000, len(PRIORITY_CLASSES)),
        rng=rng,
    )
    info = ModelInfo("sim", "1", BATCH, {1: BATCH_MS[0], BATCH: BATCH_MS[1]})
    ws = [core.add_worker(f"w{i}", [info]) for i in range(workers)]
    key = BatchKey("sim", "1", (("salt", ""),))
    classes = [PriorityClass.ENTERPRISE, PriorityClass.PAID, PriorityClass.FREE]
    tps = [(f"gristmill.requests.{c}", p) for c in PRIORITY_CLASSES for p in range(4)]
    owned = set(tps)
    t0 = 1_000_000.0
    items: list[Pending] = []
    offsets: dict[tuple[str, int], int] = {}
    for i in range(n):
        at = t0 + i / rate
        job = rng.random() < 0.2
        klass = PriorityClass.JOBS if job else classes[i % len(classes)]
        tp = (f"gristmill.requests.{klass}", i % 4)
        offsets[tp] = offsets.get(tp, -1) + 1
        msg = RequestMessage(
            request_id=f"{i:08d}-0000-4000-8000-000000000000",
            tenant_id=f"tenant-{rng.randrange(TENANTS)}",
            priority=str(klass),
            model="sim",
            version="1",
            input=f"text {i}",
            params={"salt": ""},
            deadline=at + (60.0 if job else 2.0),
            received_at=at,
            job_id="00000000-0000-4000-8000-00000000000a" if job else None,
            item_index=i if job else None,
        )
        items.append(Pending(msg, key, klass.rank, tp, offsets[tp], at))

    # (done at, worker index, entry), the worker's batches in send order
    computing: list[list[tuple[float, Any]]] = [[] for _ in ws]
    free_at = [t0] * workers
    served = 0
    now = t0
    next_item = 0
    last_commit = t0
    iterations = 0
    started = time.process_time()
    while served < n:
        iterations += 1
        # The next thing that happens: a fetch, a batch done, or a worker's wake-up.
        k = next_item
        while k < n and items[k].consumed_at <= now:
            k += 1
        if k > next_item:
            core.accept(items[next_item:k], [], owned)
            next_item = k
            core.paused(frozenset())
        for i, w in enumerate(ws):
            while computing[i] and computing[i][0][0] <= now:
                _, entry = computing[i].pop(0)
                b = entry.batch
                start = max(b.formed_at, now - entry.predicted_s)
                result = WorkResult(b.batch_id, [[0.0]] * len(b.items), None, start, now)
                for write in core.on_result(w, entry, result, now):
                    part: Any = write
                    while part is not None:  # a mixed batch's job rows follow its sync rows
                        core.done([(p.tp, p.offset) for p in part.items], len(part.items))
                        served += len(part.items)
                        part = part.then
        wake = []
        for i, w in enumerate(ws):
            step = core.schedule(w, now)
            for write in step.writes:  # expired or cancelled: durable at once here
                core.done([(p.tp, p.offset) for p in write.items], len(write.items))
                served += len(write.items)
            if step.start is not None:
                entry = step.start
                begin = max(now, free_at[i])
                free_at[i] = begin + entry.predicted_s
                computing[i].append((free_at[i], entry))
            wake.append(step.wait_until)
        if now - last_commit >= 0.1:
            core.mark_committed(core.committable(owned))
            last_commit = now
        upcoming = [c[0][0] for c in computing if c]
        if next_item < n:  # the lane's next fetch: what arrived meanwhile
            upcoming.append(max(items[next_item].consumed_at, now + fetch / rate))
        upcoming += [t for t in wake if t > now]
        now = max(now + 1e-6, min(upcoming)) if upcoming else now + 0.001
    took = time.process_time() - started
    return {
        "requests": n,
        "cpu_s": took,
        "us_per_request": took / n * 1e6,
        "steps": iterations,
    }


def _child(args: argparse.Namespace) -> None:
    got = one_round(
        args.requests, rate=args.rate, fetch=args.fetch, workers=args.workers, seed=args.seed
    )
    print(json.dumps(got))


def _run_in(tree: Path, args: argparse.Namespace, seed: int) -> float:
    cmd = [
        sys.executable,
        "-m",
        "bench.dispatch_core",
        "--child",
        f"--requests={args.requests}",
        f"--rate={args.rate}",
        f"--fetch={args.fetch}",
        f"--workers={args.workers}",
        f"--seed={seed}",
    ]
    env = {**os.environ, "PYTHONPATH": str(tree)}  # ahead of the venv's own tree
    out = subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True, text=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["us_per_request"])


def _summary(name: str, xs: list[float]) -> dict[str, Any]:
    return {
        "tree": name,
        "rounds": len(xs),
        "median_us": round(statistics.median(xs), 3),
        "min_us": round(min(xs), 3),
        "max_us": round(max(xs), 3),
        "all_us": [round(x, 3) for x in xs],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=20_000.0, help="arrivals per virtual second")
    ap.add_argument("--fetch", type=int, default=50, help="arrivals between two fetches")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--baseline", help="a git revision to measure beside this tree")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    trees: list[tuple[str, Path]] = [("this tree", REPO)]
    tmp: Path | None = None
    if args.baseline:
        tmp = Path(tempfile.mkdtemp(prefix="gm-bench-base-")) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tmp), args.baseline],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        trees.insert(0, (f"baseline {args.baseline}", tmp))
    try:
        got: dict[str, list[float]] = {name: [] for name, _ in trees}
        for r in range(args.rounds):
            # Each tree goes first every other round: an order effect cancels out.
            for name, tree in trees if r % 2 == 0 else trees[::-1]:
                got[name].append(_run_in(tree, args, args.seed + r))
        print(json.dumps([_summary(name, got[name]) for name, _ in trees], indent=1))
    finally:
        if tmp is not None:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tmp)], cwd=REPO, capture_output=True
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
