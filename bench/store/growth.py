"""The request log stays as fast at 10 million rows as at 100 thousand (issue 19 item 4).

A fresh PostgreSQL, the schema at head, daily partitions. The log is filled by SQL
(generate_series) as a steady stream would fill it: rows in time order at one rate, so
that at 10 million rows it spans ``--days`` days; at every size in ``--steps`` the
last hour holds as many rows as at any other (about 42 thousand for the defaults), as
a real log's does. The mix: 60% embedding rows (a 1,536-byte float32 vector) and 40%
sim rows (a small JSON answer); 40% of rows are job items in jobs of 5,000; 1% failed
and 1% expired; 200 tenants, skewed (the busiest has about a tenth of the rows); a
batch row per 100 requests; refusal counts and answer timeouts in proportion.

At each size:
* insert rate: ``--insert-s`` seconds of the scheduler's own write (results/store.py
  ``persist``, 3 threads like the persister's pool, batches of 256 embedding rows
  built beforehand) into the newest partition;
* every analyst question of bench/store/questions.py (docs/analysts.md) with EXPLAIN
  (ANALYZE, BUFFERS), best of 3 runs after one warm-up, on the newest data (the last
  hour, the last day, the busiest tenant, the newest job, a recent request), and what
  the plan read: index names, and any sequential scan of a log partition.

    flock /tmp/gristmill-heavy.lock .venv/bin/python -m bench.store.growth \\
        --out docs/bench/store           # ~7 min here, ~16 GB of disk at 10 M rows
    .venv/bin/python -m bench.store.growth --plot docs/bench/store/growth.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench.store.batch_rows import batch_rows
from bench.store.persist import machine
from bench.store.questions import QUESTIONS
from core.config import settings_from_env
from gristmill.devservices import PostgresServer
from gristmill.migrate import migrate_database
from results.db import make_engine
from results.partitions import create as create_partition
from results.retention import Slot, partition_name
from results.schema import RequestRow
from results.store import persist

TENANTS = 200
JOB_SIZE = 5_000
BATCH = 256
DIM = 384
# PostgreSQL for a log of this size: the defaults (128 MB of buffers, 1 GB of WAL
# between checkpoints) are sized for a laptop.
PG_SETTINGS = {
    "shared_buffers": "1GB",
    "max_wal_size": "4GB",
    "checkpoint_timeout": "15min",
    "effective_cache_size": "8GB",
    "work_mem": "32MB",
    "maintenance_work_mem": "512MB",
}

FILL_REQUESTS = """
INSERT INTO requests (request_id, tenant_id, priority, model, model_version, params, input,
    status, output, output_vector, error, attempts, batch_id, batch_size, job_id, item_index,
    received_at, produced_at, consumed_at, batched_at, compute_start_at, compute_end_at,
    persisted_at, deadline_at, kafka_topic, kafka_partition, kafka_offset)
SELECT md5(i::text || 'r')::uuid,
       tenants[1 + floor(%(tenants)s * h1 * h1)::int],
       CASE WHEN job THEN 'jobs' ELSE 'paid' END,
       CASE WHEN vec THEN 'all-minilm-l6-v2' ELSE 'sim' END, '1', '{}'::jsonb,
       CASE WHEN job THEN NULL ELSE to_jsonb('a sentence to embed, number ' || i) END,
       CASE WHEN h3 < 0.01 THEN 'failed' WHEN h3 < 0.02 THEN 'expired' ELSE 'succeeded' END,
       CASE WHEN vec OR h3 < 0.02 THEN NULL
            ELSE jsonb_build_object('digest', left(md5(i::text), 16), 'chars', 30) END,
       CASE WHEN vec AND h3 >= 0.02 THEN decode(repeat(md5(i::text), 96), 'hex') END,
       CASE WHEN h3 < 0.01 THEN 'the model failed: error ' || (i %% 3)
            WHEN h3 < 0.02 THEN 'deadline passed before a worker could run it' END,
       1, md5('b' || (i / 100))::uuid, 100,
       CASE WHEN job THEN md5('job' || (i / %(job)s))::uuid END,
       CASE WHEN job THEN (i %% %(job)s)::int END,
       rt, rt + interval '2 ms', rt + (3 + 20 * h1) * interval '1 ms',
       rt + (25 + 60 * h2) * interval '1 ms', rt + (86 + 60 * h2) * interval '1 ms',
       rt + (116 + 60 * h2 + 400 * h3 * h3) * interval '1 ms',
       rt + (121 + 60 * h2 + 500 * h3 * h3) * interval '1 ms', rt + interval '1 s',
       'gristmill.requests.paid', (i %% 6)::int, i
FROM generate_series(%(a)s::bigint, %(b)s::bigint - 1) AS i,
     LATERAL (SELECT (hashint8(i) & 1048575)::float8 / 1048576 AS h1,
                     (hashint8(i + 7919) & 1048575)::float8 / 1048576 AS h2,
                     (hashint8(i + 104729) & 1048575)::float8 / 1048576 AS h3) AS h,
     LATERAL (SELECT (i / %(job)s) %% 5 < 2 AS job, (hashint8(i + 31) & 1023) < 614 AS vec,
                     %(t0)s::timestamptz + i * %(step_us)s * interval '1 microsecond' AS rt) AS r,
     (SELECT %(tenant_ids)s::uuid[] AS tenants) AS t
"""
FILL_BATCHES = """
INSERT INTO batches (batch_id, model, model_version, batch_key, size, reason, worker_id,
    status, formed_at, compute_start_at, compute_end_at, compute_ms)
SELECT md5('b' || k)::uuid, CASE WHEN k %% 5 < 3 THEN 'all-minilm-l6-v2' ELSE 'sim' END, '1',
       'bench', 100, (ARRAY['full', 'linger', 'deadline'])[1 + (k %% 3)], 'w' || (k %% 2),
       'succeeded', ft, ft + interval '1 ms', ft + interval '31 ms', 30
FROM generate_series(%(a)s::bigint / 100, %(b)s::bigint / 100 - 1) AS k,
     LATERAL (SELECT %(t0)s::timestamptz + k * 100 * %(step_us)s * interval '1 microsecond'
                     + interval '40 ms' AS ft) AS f
"""
FILL_JOBS = """
INSERT INTO jobs (job_id, tenant_id, model, model_version, total_items, submit_state,
    succeeded, failed, expired, created_at, started_at, finished_at, expires_at)
SELECT md5('job' || j)::uuid, (%(tenant_ids)s::uuid[])[1 + (j %% 20)],
       'all-minilm-l6-v2', '1', %(job)s, 'submitted', %(job)s - 100, 50, 50,
       st, st, st + %(job)s * %(step_us)s * interval '1 microsecond', st + interval '1 day'
FROM generate_series(%(a)s::bigint / %(job)s, %(b)s::bigint / %(job)s - 1) AS j,
     LATERAL (SELECT %(t0)s::timestamptz + j * %(job)s * %(step_us)s * interval '1 microsecond'
                     AS st) AS s
WHERE j %% 5 < 2
"""
# One refusal row per 100 requests' worth of time in overload bursts, and one answer
# timeout per 200 sync requests (half of them stored later).
FILL_REFUSALS = """
INSERT INTO refusals (at, tenant_id, tier, status, reason, count)
SELECT date_trunc('second', %(t0)s::timestamptz + k * 100 * %(step_us)s * interval '1 microsecond'),
       (%(tenant_ids)s::uuid[])[1 + (k %% 7)], 'paid',
       (ARRAY[429, 503, 503, 504])[1 + (k %% 4)],
       (ARRAY['tenant_rate', 'predicted_delay', 'instance_overload', 'deadline'])[1 + (k %% 4)],
       1 + (k %% 50)
FROM generate_series(%(a)s::bigint / 100, %(b)s::bigint / 100 - 1) AS k
"""
FILL_TIMEOUTS = """
INSERT INTO answer_timeouts (request_id, received_at, tenant_id, gave_up_at)
SELECT request_id, received_at, tenant_id, received_at + interval '1 s'
FROM requests
WHERE received_at >= %(t0)s::timestamptz + %(a)s * %(step_us)s * interval '1 microsecond'
  AND received_at < %(t0)s::timestamptz + %(b)s * %(step_us)s * interval '1 microsecond'
  AND job_id IS NULL AND (kafka_offset %% 200) = 0
"""
FILL_CHUNK = 500_000


class LogBench:
    def __init__(self, workdir: Path, days: float, final_rows: int):
        self.pg = PostgresServer(workdir, fast=False)
        self.days = days
        self.step_us = days * 86400e6 / final_rows
        end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        self.t0 = end - timedelta(days=days)
        self.rows = 0
        self.tenant_ids: list[str] = []
        self.env: dict[str, str] = {}

    # ---- setup ---------------------------------------------------------------------------
    def start(self) -> None:
        self.pg.start()
        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            for k, v in PG_SETTINGS.items():
                conn.execute(f"ALTER SYSTEM SET {k} = '{v}'")
        self.pg.restart()
        self.env = {"DATABASE_URL": self.pg.url, "GRISTMILL_ALLOW_WEAK_DURABILITY": "true"}
        settings = settings_from_env(self.env)
        migrate_database(settings)
        self.engine = make_engine(settings.database_url, pool_size=4)
        day = timedelta(days=1)
        first = self.t0.replace(hour=0)
        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            # A log long past its migration (the old table's partition dropped), its
            # daily partitions made over the days it will span.
            for table in ("requests", "answer_timeouts", "refusals"):
                for (name,) in conn.execute(
                    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                    "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = %s",
                    (table,),
                ).fetchall():
                    conn.execute(f"DROP TABLE {name}")
            ids = conn.execute(
                "INSERT INTO tenants (name, tier) SELECT 'bench-t' || n, 'paid' "
                "FROM generate_series(1, %s) n RETURNING id",
                (TENANTS,),
            ).fetchall()
            self.tenant_ids = [str(r[0]) for r in ids]
            conn.execute(
                "INSERT INTO models (name, version, max_batch_size) VALUES "
                "('sim', '1', 100), ('all-minilm-l6-v2', '1', 256)"
            )
        n_days = int(self.days) + 3
        for table, key in (
            ("requests", "received_at"),
            ("answer_timeouts", "received_at"),
            ("refusals", "at"),
        ):
            for d in range(n_days):
                lo = first + d * day
                create_partition(
                    self.engine, Slot(table, partition_name(table, lo, day), lo, lo + day), key
                )

    def stop(self) -> None:
        self.engine.dispose()
        self.pg.stop()
        shutil.rmtree(self.pg.workdir, ignore_errors=True)

    # ---- filling -------------------------------------------------------------------------
    def fill_to(self, target: int) -> None:
        """Fill rows [self.rows, target) in time order."""
        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = off")
            a = self.rows
            while a < target:
                b = min(target, a + FILL_CHUNK)
                p = {
                    "a": a,
                    "b": b,
                    "t0": self.t0,
                    "step_us": self.step_us,
                    "tenants": TENANTS,
                    "job": JOB_SIZE,
                    "tenant_ids": self.tenant_ids,
                }
                for sql in (FILL_REQUESTS, FILL_BATCHES, FILL_JOBS, FILL_REFUSALS, FILL_TIMEOUTS):
                    conn.execute(sql, p)
                a = b
            conn.execute("ANALYZE")
        self.rows = target

    @property
    def newest(self) -> datetime:
        return self.t0 + timedelta(microseconds=self.rows * self.step_us)

    # ---- the scheduler's write -------------------------------------------------------
    def _rows(self, n: int, at: datetime) -> list[RequestRow]:
        vec = bytes(range(256)) * (DIM * 4 // 256)
        return batch_rows([vec] * n, self.tenant_ids[0], at)

    def insert_rate(self, seconds: float, threads: int = 3) -> dict[str, Any]:
        at = self.newest - timedelta(minutes=1)
        pool = [self._rows(BATCH, at) for _ in range(int(seconds * 200))]
        written = [0] * threads
        lat: list[float] = []
        stop = time.perf_counter() + seconds
        lock = threading.Lock()

        def work(k: int) -> None:
            while time.perf_counter() < stop:
                with lock:
                    if not pool:
                        return
                    rows = pool.pop()
                t = time.perf_counter()
                persist(self.engine, rows, None)
                with lock:
                    lat.append(time.perf_counter() - t)
                written[k] += len(rows)

        t0 = time.perf_counter()
        ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        dt = time.perf_counter() - t0
        lat.sort()
        return {
            "rows_per_s": round(sum(written) / dt, 1),
            "batch_ms_p50": round(1000 * lat[len(lat) // 2], 2),
            "batch_ms_p95": round(1000 * lat[int(len(lat) * 0.95)], 2),
        }

    # ---- the questions -----------------------------------------------------------------
    def params(self) -> dict[str, Any]:
        end = self.newest
        with psycopg.connect(self.pg.dsn) as conn:
            rid = conn.execute(
                "SELECT request_id FROM requests WHERE received_at >= %s AND received_at < %s "
                "AND output_vector IS NOT NULL ORDER BY received_at LIMIT 1",
                (end - timedelta(minutes=30), end),
            ).fetchone()
            job = conn.execute(
                "SELECT job_id FROM jobs WHERE finished_at <= %s ORDER BY created_at DESC LIMIT 1",
                (end,),
            ).fetchone()
        return {
            "tenant": self.tenant_ids[0],
            "hour_start": end - timedelta(hours=1),
            "hour_end": end,
            "day_start": end - timedelta(days=1),
            "day_end": end,
            "request_id": str(rid[0]) if rid else str(uuid.uuid4()),
            "job_id": str(job[0]) if job else str(uuid.uuid4()),
        }

    def explain(self, sql: str, params: dict[str, Any], runs: int = 3) -> dict[str, Any]:
        with psycopg.connect(self.pg.dsn) as conn:
            conn.execute(sql, params).fetchall()  # warm-up
            best: dict[str, Any] | None = None
            times = []
            for _ in range(runs):
                (plan,) = conn.execute(
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params
                ).fetchone()  # type: ignore[misc]
                top = plan[0]
                ms = top["Planning Time"] + top["Execution Time"]
                times.append(ms)
                if best is None or ms <= min(times):
                    best = top
        assert best is not None
        nodes = list(_nodes(best["Plan"]))
        seq = sorted(
            {
                n.get("Relation Name", "")
                for n in nodes
                if n["Node Type"] == "Seq Scan"
                and n.get("Relation Name", "").startswith(("requests", "answer_timeouts"))
            }
        )
        return {
            "ms": round(min(times), 2),
            "ms_median": round(statistics.median(times), 2),
            "planning_ms": round(best["Planning Time"], 2),
            "rows": best["Plan"].get("Actual Rows"),
            "indexes": sorted({n["Index Name"] for n in nodes if "Index Name" in n}),
            "log_seq_scans": seq,
            "shared_read": best["Plan"].get("Shared Read Blocks", 0),
        }

    def sizes(self) -> dict[str, Any]:
        with psycopg.connect(self.pg.dsn) as conn:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM pg_inherits i JOIN pg_class p ON p.oid = "
                "i.inhparent WHERE p.relname = 'requests'), "
                "(SELECT sum(pg_total_relation_size(c.oid)) FROM pg_inherits i "
                "JOIN pg_class p ON p.oid = i.inhparent JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE p.relname = 'requests')"
            ).fetchone()
        assert row is not None
        return {"partitions": row[0], "requests_bytes": int(row[1] or 0)}


def _nodes(plan: dict[str, Any]) -> Any:
    yield plan
    for p in plan.get("Plans", []):
        yield from _nodes(p)


def run(args: argparse.Namespace) -> dict[str, Any]:
    steps = [int(s) for s in args.steps.split(",")]
    pg_dir = Path(tempfile.mkdtemp(prefix="gristmill-pg-"))
    pg_dir.chmod(0o711)
    bench = LogBench(pg_dir, args.days, steps[-1])
    out: dict[str, Any] = {
        "steps": [],
        "days_at_last_step": args.days,
        "rows_per_hour": round(3600e6 / bench.step_us),
        "pg_settings": PG_SETTINGS,
        "machine": machine(),
        "questions": {q.key: q.ask for q in QUESTIONS},
    }
    try:
        bench.start()
        for target in steps:
            t = time.perf_counter()
            bench.fill_to(target)
            fill_s = time.perf_counter() - t
            step: dict[str, Any] = {"rows": target, "fill_s": round(fill_s, 1)}
            step.update(bench.sizes())
            step["insert"] = bench.insert_rate(args.insert_s)
            params = bench.params()
            step["queries"] = {q.key: bench.explain(q.sql, params) for q in QUESTIONS}
            out["steps"].append(step)
            print(json.dumps({k: v for k, v in step.items() if k != "queries"}), flush=True)
            for k, v in step["queries"].items():
                print(f"  {k}: {v['ms']} ms, idx {v['indexes']}, seq {v['log_seq_scans']}")
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / "growth.json").write_text(json.dumps(out, indent=2, default=str))
        return out
    finally:
        bench.stop()


def plot(path: Path, out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(path.read_text())
    steps = data["steps"]
    rows = [s["rows"] for s in steps]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    a.plot(rows, [s["insert"]["rows_per_s"] for s in steps], "o-", color="tab:blue")
    a.set_xscale("log")
    a.set_ylim(bottom=0)
    a.set_xlabel("rows in the request log")
    a.set_ylabel("rows/s (scheduler's write, 3 threads, batches of 256 vectors)")
    a.set_title("insert rate")
    for key in data["questions"]:
        b.plot(rows, [s["queries"][key]["ms"] for s in steps], "o-", label=key)
    b.set_xscale("log")
    b.set_yscale("log")
    b.set_xlabel("rows in the request log")
    b.set_ylabel("ms (planning + execution, best of 3)")
    b.set_title("analysts' questions (docs/analysts.md)")
    b.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out_dir / "growth.png", dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", default="100000,1000000,3000000,10000000")
    ap.add_argument("--days", type=float, default=10.0)
    ap.add_argument("--insert-s", type=float, default=10.0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--plot", type=Path, help="draw growth.png from a saved growth.json")
    args = ap.parse_args()
    if args.plot:
        plot(args.plot, args.plot.parent)
        return
    run(args)
    if args.out:
        plot(args.out / "growth.json", args.out)


if __name__ == "__main__":
    main()
