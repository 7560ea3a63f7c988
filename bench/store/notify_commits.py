"""Commits a second of writers that announce what they wrote, with the NOTIFY inside the
data's transaction or in one of its own after it.

PostgreSQL serializes every transaction that sends a NOTIFY: the sender takes a lock of
the whole cluster before its commit and holds it until the commit is done, its WAL
flush included (src/backend/commands/async.c, ``PreCommit_Notify``). So announcing
writers commit one flush at a time, whatever group commit would do for them, and a host
with more scheduler processes (more, smaller writes) meets that limit sooner. On a
2-GPU host (12 schedulers) sync results waited tens of ms to commit at 5,000 req/s
where 6 schedulers committed in 2-4 ms at 10,000 (docs/bench/gpu-host.md, r10).

Variants, each on the same fresh durable server (fsync and synchronous_commit on), one
transaction a loop per writer thread, a row of the given size each:

* ``plain``: the row, committed (no announcement: the group-commit ceiling);
* ``inside``: the row and its NOTIFY in one transaction (results/store.py before
  decision 70's amendment);
* ``after``: the row committed, then the NOTIFY in a transaction of its own with
  ``synchronous_commit`` off (it writes nothing that needs the flush), both sent in one
  pipelined round trip.

    python3 -m bench.store.notify_commits --threads 12 --seconds 8 --out docs/bench/store
    # a disk whose flush takes 2 ms more (PostgreSQL's commit_delay before each flush):
    python3 -m bench.store.notify_commits --flush-delay-us 2000 --out docs/bench/store
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from gristmill.devservices import PostgresServer

VARIANTS = ("plain", "inside", "after")


def _writer(dsn: str, variant: str, stop: float, payload: str, out: list[float]) -> None:
    with psycopg.connect(dsn) as pg:
        cur = pg.cursor()
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            with pg.pipeline():
                cur.execute("INSERT INTO w (body) VALUES (%s)", (payload,))
                if variant == "inside":
                    cur.execute("SELECT pg_notify('bench', %s)", (payload,))
                pg.commit()
                if variant == "after":
                    cur.execute("SET LOCAL synchronous_commit TO off")
                    cur.execute("SELECT pg_notify('bench', %s)", (payload,))
                    pg.commit()
            out.append(time.perf_counter() - t0)


def _listener(dsn: str, stop: float, heard: list[int]) -> None:
    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute("LISTEN bench")
        n = 0
        for _ in pg.notifies(timeout=max(0.1, stop - time.monotonic() + 1)):
            n += 1
        heard.append(n)


def run(dsn: str, variant: str, threads: int, seconds: float, size: int) -> dict[str, Any]:
    payload = "x" * size
    stop = time.monotonic() + seconds
    lat: list[list[float]] = [[] for _ in range(threads)]
    heard: list[int] = []
    listener = threading.Thread(target=_listener, args=(dsn, stop, heard))
    listener.start()
    time.sleep(0.3)
    ts = [
        threading.Thread(target=_writer, args=(dsn, variant, stop, payload, lat[i]))
        for i in range(threads)
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    listener.join()
    every = sorted(x for xs in lat for x in xs)
    return {
        "variant": variant,
        "threads": threads,
        "commits_per_s": round(len(every) / seconds),
        "write_ms_p50": round(1000 * statistics.median(every), 2),
        "write_ms_p95": round(1000 * every[int(0.95 * (len(every) - 1))], 2),
        "heard": heard[0] if heard else 0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=12)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--size", type=int, default=2500, help="bytes a row and a payload")
    ap.add_argument("--rounds", type=int, default=2, help="each variant, interleaved")
    ap.add_argument(
        "--flush-delay-us",
        type=int,
        default=0,
        help="PostgreSQL's commit_delay before each WAL flush: a slower disk's flush",
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="notify-commits-") as work:
        Path(work).chmod(0o711)  # the server's own user reaches its data dir through it
        slow = {"commit_delay": args.flush_delay_us, "commit_siblings": 0}
        pg = PostgresServer(Path(work) / "pg", fast=False, settings=slow)
        pg.start()
        try:
            with psycopg.connect(pg.dsn, autocommit=True) as c:
                c.execute("CREATE TABLE w (id bigserial PRIMARY KEY, body text)")
            rows = []
            for r in range(args.rounds):
                for v in VARIANTS:
                    got = run(pg.dsn, v, args.threads, args.seconds, args.size)
                    row = {"round": r, "flush_delay_us": args.flush_delay_us, **got}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
        finally:
            pg.stop()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        name = f"notify-commits-delay{args.flush_delay_us}.json" if args.flush_delay_us else ""
        (args.out / (name or "notify-commits.json")).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
