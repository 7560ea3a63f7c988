"""Job rows a second a durable PostgreSQL commits, and what the writers wait on.

The GPU-host runs (docs/bench/gpu-host.md, r4) found job rows waiting seconds between
their computation and their commit, at 16,000-19,000 rows/s on three machines and
36,700 on a fourth. Two explanations compete: the job's counter row, locked by every
write from its counter update to its commit (results/jobs.py), serializes the writes of
one job - and with group commit every write holds every job it merged; or the server's
own write path (WAL flush, checkpoints with full-page images, a small buffer pool) is
the limit. This bench separates them with the scheduler's own write (results/store.py
``ResultWriter``, the persister's merged 4,096-row transactions of the embedding
model's 384-float rows) and nothing else: no Kafka, no workers.

Each variant runs on a fresh server and reports rows/s, each write's latency, WAL bytes
a row, checkpoints, and what the writers waited on (``pg_stat_activity`` sampled every
20 ms: a row lock, the WAL's flush, a buffer's I/O...). Variants:

* ``counters`` / ``plain``: the job rows as the scheduler writes them, or the same rows
  without their job (no counter row is touched: what the lock costs);
* ``jobs=N``: the rows spread over N jobs, every write holding items of each;
* ``conf=default|host``: PostgreSQL's defaults, or sized for the host
  (gristmill/devservices/pg_sizing.py, as the GPU-host bench starts it).

    python3 -m bench.store.commit_rate --rows 400000 --threads 6 --out docs/bench/store
"""

from __future__ import annotations

import argparse
import io
import json
import os
import queue
import statistics
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import psycopg

from core.config import Settings
from core.messages import RequestMessage
from core.vocab import RequestStatus
from gristmill.devservices import PostgresServer
from gristmill.devservices.pg_sizing import host_settings
from gristmill.migrate import migrate_database
from results.db import make_engine
from results.store import ResultWriter
from results.tenants import create_tenant
from scheduler.core.batcher import Batch, BatchKey, FlushReason, Pending
from scheduler.core.plans import Write
from scheduler.runtime.rows import write_rows

DIM = 384  # all-minilm-l6-v2's output
BATCH = 1024  # a GPU batch
MERGED = 4  # batches a write merges (the persister's MERGE_ROWS = 4,096 rows)
MODEL = "all-minilm-l6-v2"
SENTENCE = "the quick brown fox jumps over the lazy dog near the river bank at dawn #{i}"


def _writes(tenant: str, jobs: list[str], rows: int, counters: bool) -> list[tuple[list, list]]:
    """Every write's (request rows, batch rows), built before the clock starts. A write
    holds MERGED batches; with several jobs, each batch is of one job, round robin."""
    key = BatchKey(MODEL, "1", (("normalize", True),))
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((BATCH, DIM)).astype(np.float32)
    now = time.time()
    out: list[tuple[list, list]] = []
    index = Counter[str]()
    for w in range(rows // (BATCH * MERGED)):
        request_rows: list = []
        batch_rows: list = []
        for b in range(MERGED):
            job = jobs[(w * MERGED + b) % len(jobs)]
            items = []
            for k in range(BATCH):
                i = index[job]
                index[job] += 1
                m = RequestMessage(
                    request_id=str(uuid.uuid4()),
                    tenant_id=tenant,
                    priority="jobs",
                    model=MODEL,
                    version="1",
                    input=SENTENCE.format(i=i),
                    params={"normalize": True},
                    deadline=now + 3600,
                    received_at=now,
                    job_id=job if counters else None,
                    item_index=i if counters else None,
                )
                items.append(Pending(m, key, 4, ("gristmill.requests.jobs", k % 6), i, now))
            batch = Batch(key, items, now, FlushReason.FULL)
            rs, brow = write_rows(
                Write(
                    4,
                    RequestStatus.SUCCEEDED,
                    items,
                    batch=batch,
                    outputs=vectors,
                    compute=(now, now),
                    worker_id="gpu",
                    batch_row=True,
                )
            )
            request_rows += rs
            if brow is not None:
                batch_rows.append(brow)
        out.append((request_rows, batch_rows))
    return out


def _job_items(dsn: str, writes: list[tuple[list, list]]) -> None:
    """The job_items rows the counter update joins (as a submitted job has them)."""
    buf = io.StringIO()
    for request_rows, _ in writes:
        for r in request_rows:
            buf.write(f'{r["job_id"]}\t{r["item_index"]}\t"x"\t{r["request_id"]}\t0\n')
    with (
        psycopg.connect(dsn, autocommit=True) as pg,
        pg.cursor() as cur,
        cur.copy(
            "COPY job_items (job_id, item_index, input, request_id, attempt) FROM STDIN"
        ) as cp,
    ):
        cp.write(buf.getvalue())


def _stats(dsn: str) -> dict[str, float]:
    with psycopg.connect(dsn, autocommit=True) as pg:
        wal = pg.execute("SELECT wal_bytes, wal_fpi, wal_sync FROM pg_stat_wal").fetchone()
        ck = pg.execute(
            "SELECT checkpoints_timed + checkpoints_req, buffers_backend FROM pg_stat_bgwriter"
        ).fetchone()
    assert wal is not None and ck is not None
    return {
        "wal_bytes": float(wal[0]),
        "wal_fpi": float(wal[1]),
        "wal_sync": float(wal[2]),
        "checkpoints": float(ck[0]),
        "buffers_backend": float(ck[1]),
    }


def _sampler(dsn: str, stop: threading.Event, waits: Counter[str]) -> None:
    """What the writers' backends are doing, every 20 ms."""
    with psycopg.connect(dsn, autocommit=True) as pg:
        while not stop.is_set():
            for etype, event in pg.execute(
                "SELECT wait_event_type, wait_event FROM pg_stat_activity "
                "WHERE application_name = 'commit_rate' AND state = 'active'"
            ):
                waits[f"{etype}:{event}" if etype else "cpu"] += 1
            time.sleep(0.02)


def variant(args: argparse.Namespace, conf: str, jobs: int, counters: bool) -> dict[str, Any]:
    settings = host_settings(psutil.virtual_memory().total) if conf == "host" else {}
    with tempfile.TemporaryDirectory(prefix="commit-rate-") as work:
        Path(work).chmod(0o711)  # the server's own user reaches its data dir through it
        pg = PostgresServer(Path(work) / "pg", fast=False, settings=settings)
        pg.start()
        try:
            migrate_database(Settings(database_url=pg.url))
            with make_engine(pg.url).begin() as conn:
                tenant = create_tenant(conn, f"bench-{uuid.uuid4().hex[:6]}", "paid")
                ids = [str(uuid.uuid4()) for _ in range(jobs)]
                for job in ids:
                    conn.exec_driver_sql(
                        "INSERT INTO jobs (job_id, tenant_id, model, model_version, "
                        "total_items, submit_state, expires_at) VALUES (%s, %s, %s, '1', %s, "
                        "'submitted', now() + interval '1 day')",
                        (job, tenant.id, MODEL, args.rows),
                    )
            writes = _writes(tenant.id, ids, args.rows, counters)
            if counters:
                _job_items(pg.dsn, writes)
            return _timed(args, pg.dsn + "?application_name=commit_rate", writes) | {
                "conf": conf,
                "jobs": jobs,
                "counters": counters,
                "settings": settings,
            }
        finally:
            pg.stop()


def _timed(args: argparse.Namespace, dsn: str, writes: list[tuple[list, list]]) -> dict[str, Any]:
    todo: queue.Queue[tuple[list, list] | None] = queue.Queue()
    for w in writes:
        todo.put(w)
    for _ in range(args.threads):
        todo.put(None)
    writer = ResultWriter(dsn)
    latencies: list[float] = []
    waits: Counter[str] = Counter()

    def thread() -> None:
        while (w := todo.get()) is not None:
            t = time.perf_counter()
            writer(*w)
            latencies.append(time.perf_counter() - t)

    before = _stats(dsn)
    stop = threading.Event()
    sampler = threading.Thread(target=_sampler, args=(dsn, stop, waits), daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=thread) for _ in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    stop.set()
    writer.close()
    after = _stats(dsn)
    rows = sum(len(r) for r, _ in writes)
    delta = {k: after[k] - before[k] for k in after}
    total = sum(waits.values()) or 1
    lat = sorted(latencies)
    return {
        "rows": rows,
        "threads": args.threads,
        "seconds": round(wall, 2),
        "rows_per_s": round(rows / wall),
        "write_ms_p50": round(statistics.median(lat) * 1e3, 1),
        "write_ms_p95": round(lat[int(0.95 * (len(lat) - 1))] * 1e3, 1),
        "wal_bytes_per_row": round(delta["wal_bytes"] / rows),
        "wal_full_page_images": int(delta["wal_fpi"]),
        "wal_syncs": int(delta["wal_sync"]),
        "checkpoints": int(delta["checkpoints"]),
        "buffers_written_by_backends": int(delta["buffers_backend"]),
        "waits": {k: round(v / total, 3) for k, v in waits.most_common(8)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--threads", type=int, default=6, help="persist threads writing jobs")
    ap.add_argument(
        "--variants",
        default="default:1:counters,default:1:plain,default:4:counters,"
        "host:1:counters,host:1:plain,host:4:counters",
        help="conf:jobs:counters|plain, comma separated",
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    result: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "runs": [],
    }
    for spec in args.variants.split(","):
        conf, jobs, kind = spec.split(":")
        r = variant(args, conf, int(jobs), kind == "counters")
        print(json.dumps(r), flush=True)
        result["runs"].append(r)
        if args.out:  # after each variant: a run cut short keeps what it measured
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "commit_rate.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
