"""Result rows per second a scheduler persists, end to end through Kafka (issue 19).

A fresh Kafka and PostgreSQL on loopback; ``--rows`` request messages of the embedding
model's shape are produced into Kafka first (sync requests of a paid tenant, or the
items of one job), then a scheduler with ``--workers`` sim workers in vector mode
(``GRISTMILL_SIM_VECTOR_DIM=384``, 0 ms per batch, 256 a batch: the embedding model's
output shape and batch limit at no compute cost) is started and drains them. So the
rate measured is the scheduler's whole path but the model: Kafka consumer, batcher,
worker socket (384 float32 per row pickled back), rows, the PostgreSQL write and the
announcements, and the offset commits.

Reported: rows/s over the steady middle of the drain (10%..90% of the rows, by the
server's own insert counter), MB/s into the table and the WAL, and CPU seconds per row
of each process group (scheduler, its workers, PostgreSQL, Kafka, this process, which
listens to the announcements as an API instance would). ``--profile S`` also records
the scheduler with py-spy for S seconds in the steady state and prints where its time
goes (a second run: the profiler's own cost stays out of the rates).

    flock /tmp/gristmill-heavy.lock .venv/bin/python -m bench.store.persist \\
        --rows 200000 --kind sync --out docs/bench/store
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import psycopg
from confluent_kafka import Producer

from bench.peers.procs import cpu_seconds, thread_cpu
from bench.store.pyspy import py_spy, summarize_raw
from core.config import settings_from_env
from core.kafka import producer_config
from core.messages import RequestMessage
from core.topics import ensure_topics, request_topic
from gristmill.devservices import KafkaCluster, PostgresServer
from gristmill.devservices.procs import children
from gristmill.devservices.stack import REPO, scheduler_command
from gristmill.migrate import migrate_database
from results.db import libpq_url, make_engine
from results.tenants import create_tenant

DIM = 384  # all-minilm-l6-v2's output
BATCH = 256  # its batch limit (GRISTMILL_EMBED_MAX_BATCH's default)
# A typical sentence to embed: the stored input is its text.
SENTENCE = "the quick brown fox jumps over the lazy dog near the river bank at dawn #{i}"


def machine() -> dict[str, Any]:
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in ln
        ),
        "?",
    )
    return {"cpu": cpu, "cores": os.cpu_count(), "python": sys.version.split()[0]}


class Stack:
    """Kafka, PostgreSQL, the schema, topics and one tenant for a benchmark run."""

    def __init__(self, workdir: Path, *, durable: bool, extra_env: dict[str, str]):
        self.workdir = workdir
        self.kafka = KafkaCluster(workdir / "kafka", partitions=3)
        pg_dir = Path(tempfile.mkdtemp(prefix="gristmill-pg-"))
        pg_dir.chmod(0o711)
        # durable: fsync and synchronous commit on, as a deployment runs.
        self.pg = PostgresServer(pg_dir, fast=not durable)
        self.extra_env = extra_env
        self.env: dict[str, str] = {}
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        self.kafka.start()
        self.pg.start()
        run = uuid.uuid4().hex[:8]
        self.env = {
            **os.environ,
            "KAFKA_BOOTSTRAP": self.kafka.bootstrap,
            "DATABASE_URL": self.pg.url,
            "GRISTMILL_TOPIC_PREFIX": f"gm-bench-{run}",
            "GRISTMILL_CONSUMER_GROUP": f"gm-bench-{run}",
            "GRISTMILL_TOPIC_PARTITIONS": "3",
            "GRISTMILL_ALLOW_WEAK_DURABILITY": "true",  # one broker
            # Near zero, not zero: a batch cost of 0 ms divides by zero in the capacity
            # report (scheduler/core/capacity.py).
            "GRISTMILL_SIM_BATCH_MS": "0.01",
            "GRISTMILL_SIM_MAX_BATCH": str(BATCH),
            "GRISTMILL_SIM_VECTOR_DIM": str(DIM),
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }
        settings = settings_from_env(self.env)
        migrate_database(settings)
        ensure_topics(settings)

    @property
    def settings(self) -> Any:
        return settings_from_env(self.env)

    def start_scheduler(self, workers: int) -> subprocess.Popen[bytes]:
        run_dir = Path(tempfile.mkdtemp(prefix="gm-bench-"))
        log = (self.workdir / "scheduler.log").open("ab")
        p = subprocess.Popen(
            scheduler_command(workers, "sim", run_dir),
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
        )
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, 15)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, 9)
                    p.wait()
        self.kafka.stop()
        self.pg.stop()
        shutil.rmtree(self.pg.workdir, ignore_errors=True)


def produce(stack: Stack, kind: str, rows: int) -> dict[str, Any]:
    """Put ``rows`` request messages into Kafka (before any scheduler reads them)."""
    s = stack.settings
    with make_engine(s.database_url).begin() as conn:
        tenant = create_tenant(conn, f"bench-{uuid.uuid4().hex[:6]}", "paid")
        job_id = None
        if kind == "job":
            job_id = str(uuid.uuid4())
            conn.exec_driver_sql(
                "INSERT INTO jobs (job_id, tenant_id, model, model_version, total_items, "
                "submit_state, expires_at) VALUES (%s, %s, 'sim', '1', %s, 'submitted', "
                "now() + interval '1 day')",
                (job_id, tenant.id, rows),
            )
    priority = "jobs" if kind == "job" else "paid"
    topic = request_topic(s, priority)
    producer = Producer(producer_config(s, **{"linger.ms": 20, "batch.size": 1_000_000}))
    now = time.time()
    t0 = time.perf_counter()
    for i in range(rows):
        msg = RequestMessage(
            request_id=str(uuid.uuid4()),
            tenant_id=tenant.id,
            priority=priority,
            model="sim",
            version="1",
            input=SENTENCE.format(i=i),
            params={"salt": ""},
            deadline=now + 3600,  # nothing expires: every row is a computed result
            # Sync requests arrive one by one; a job's items share its acceptance time.
            received_at=now if job_id else now + i * 1e-5,
            job_id=job_id,
            item_index=i if job_id else None,
        )
        while True:
            try:
                producer.produce(topic, msg.encode())
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if left:
        raise RuntimeError(f"{left} messages not delivered")
    return {"tenant_id": tenant.id, "job_id": job_id, "produce_s": time.perf_counter() - t0}


class Listener(threading.Thread):
    """LISTENs to result announcements as an API instance does, and counts them."""

    def __init__(self, dsn: str, channel: str):
        super().__init__(daemon=True, name="listener")
        self.dsn, self.channel = dsn, channel
        self.notes = 0
        self.bytes = 0
        self.stop_flag = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"LISTEN {self.channel}")
            while not self.stop_flag.is_set():
                for note in conn.notifies(timeout=0.5):
                    self.notes += 1
                    self.bytes += len(note.payload)


def pg_pids(stack: Stack) -> list[int]:
    pid = stack.pg.pid
    return [] if pid is None else [pid]


def kafka_pids(stack: Stack) -> list[int]:
    return [n.proc.pid for n in stack.kafka._nodes if n.proc is not None]


def sample(stack: Stack, sched: int, dsn: str) -> dict[str, Any]:
    """One look at progress and every process group's CPU seconds."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Summed over the log's partitions: a partitioned table counts and holds nothing
        # itself (the log before it was partitioned has no tree: the table alone).
        inserted, rel, wal = conn.execute(
            "WITH t AS (SELECT relid FROM pg_partition_tree('requests') "
            "UNION SELECT 'requests'::regclass) "
            "SELECT coalesce((SELECT sum(s.n_tup_ins) FROM pg_stat_user_tables s "
            "JOIN t ON t.relid = s.relid), 0), "
            "(SELECT sum(pg_total_relation_size(relid)) FROM t), "
            "pg_current_wal_lsn() - '0/0'::pg_lsn"
        ).fetchone()  # type: ignore[misc]
    workers = children(sched)
    cpu = psutil.cpu_times()
    return {
        "t": time.perf_counter(),
        "wall": time.time(),
        "rows": int(inserted),
        "table_bytes": int(rel),
        "wal_bytes": int(wal),
        "cpu": {
            "scheduler": cpu_seconds(sched, recursive=False),
            "workers": sum(cpu_seconds(w) for w in workers),
            "postgres": sum(cpu_seconds(p) for p in pg_pids(stack)),
            "kafka": sum(cpu_seconds(p) for p in kafka_pids(stack)),
            "bench": cpu_seconds(os.getpid(), recursive=False),
        },
        # The whole machine's busy CPU: what is not the groups above ran beside the
        # benchmark (on a shared machine, other people's work) and is reported as such.
        "machine_busy": cpu.user + cpu.nice + cpu.system + cpu.irq + cpu.softirq + cpu.steal,
    }


def drain(
    stack: Stack, sched: int, rows: int, *, during: Callable[[], None] | None = None
) -> list[dict[str, Any]]:
    """Samples every 0.5 s until every row is in (or the scheduler stops making progress).

    The samples' row counts are PostgreSQL's statistics, which a busy backend reports at
    most once a second and an idle one up to 10 s late: they pace the sampling, and once
    they stall the rows are counted exactly. The rates come from the rows themselves
    (``exact_progress``)."""
    dsn = libpq_url(stack.settings.database_url)
    samples = [sample(stack, sched, dsn)]
    stalled_since = time.perf_counter()
    ran_during = False
    while samples[-1]["rows"] < rows:
        time.sleep(0.5)
        samples.append(sample(stack, sched, dsn))
        if samples[-1]["rows"] > samples[-2]["rows"]:
            stalled_since = time.perf_counter()
        elif time.perf_counter() - stalled_since > 1.0 and count_rows(dsn) >= rows:
            break  # all in; the statistics have not caught up
        elif time.perf_counter() - stalled_since > 120:
            raise RuntimeError(f"no progress for 120 s at {samples[-1]['rows']} rows")
        if during is not None and not ran_during and samples[-1]["rows"] > rows * 0.2:
            ran_during = True
            during()
    return samples


def count_rows(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        (n,) = conn.execute("SELECT count(*) FROM requests").fetchone()  # type: ignore[misc]
    return int(n)


def exact_progress(samples: list[dict[str, Any]], dsn: str) -> None:
    """Each sample's ``rows``: the rows whose transaction had begun by the sample's time
    (``persisted_at``, the transaction's start; a write's transaction lasts milliseconds
    to a few hundred), read from the rows after the drain."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        times = [
            t
            for (t,) in conn.execute(
                "SELECT extract(epoch FROM persisted_at)::float8 FROM requests ORDER BY 1"
            )
        ]
    for s in samples:
        s["rows"] = bisect.bisect_right(times, s["wall"])


def steady(samples: list[dict[str, Any]], rows: int) -> dict[str, Any]:
    """Rates between the samples nearest 10% and 90% of the rows."""
    a = next(s for s in samples if s["rows"] >= rows * 0.1)
    b = next(s for s in samples if s["rows"] >= rows * 0.9)
    dt, dn = b["t"] - a["t"], b["rows"] - a["rows"]
    cpu = {k: b["cpu"][k] - a["cpu"][k] for k in a["cpu"]}
    others = b["machine_busy"] - a["machine_busy"] - sum(cpu.values())
    return {
        "window_s": round(dt, 2),
        "rows": dn,
        "rows_per_s": round(dn / dt, 1),
        "table_mb_per_s": round((b["table_bytes"] - a["table_bytes"]) / dt / 1e6, 2),
        "wal_mb_per_s": round((b["wal_bytes"] - a["wal_bytes"]) / dt / 1e6, 2),
        "table_bytes_per_row": round((b["table_bytes"] - a["table_bytes"]) / dn),
        "wal_bytes_per_row": round((b["wal_bytes"] - a["wal_bytes"]) / dn),
        "cpu_cores": {k: round(v / dt, 3) for k, v in cpu.items()},
        "cpu_us_per_row": {k: round(v / dn * 1e6, 1) for k, v in cpu.items()},
        "cpu_us_per_row_total": round(sum(cpu.values()) / dn * 1e6, 1),
        "other_processes_cores": round(max(0.0, others) / dt, 3),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="gm-store-bench-"))
    extra = dict(kv.split("=", 1) for kv in args.env)
    stack = Stack(workdir, durable=not args.fast, extra_env=extra)
    try:
        stack.start()
        made = produce(stack, args.kind, args.rows)
        listener = Listener(libpq_url(stack.settings.database_url), "gristmill_results")
        listener.start()
        sched = stack.start_scheduler(args.workers)
        profile: dict[str, Any] = {}

        def record() -> None:
            raw = workdir / "pyspy.txt"
            subprocess.run(
                [
                    py_spy(),
                    "record",
                    "--threads",
                    "--pid",
                    str(sched.pid),
                    "--duration",
                    str(args.profile),
                    "--rate",
                    "200",
                    "--format",
                    "raw",
                    "--output",
                    str(raw),
                    "--nonblocking",
                    # gil: only the thread holding the interpreter lock (the Python time
                    # that bounds the scheduler); wall: every thread, waiting included.
                    "--gil" if args.profile_mode == "gil" else "--idle",
                ],
                check=True,
                capture_output=True,
            )
            profile.update(summarize_raw(raw.read_text()))

        threads_before = thread_cpu(sched.pid)
        t0 = time.perf_counter()
        samples = drain(stack, sched.pid, args.rows, during=record if args.profile else None)
        exact_progress(samples, libpq_url(stack.settings.database_url))
        threads_after = thread_cpu(sched.pid)
        listener.stop_flag.set()
        with psycopg.connect(libpq_url(stack.settings.database_url)) as conn:
            exact, span = conn.execute(
                "SELECT count(*), extract(epoch FROM max(persisted_at) - min(persisted_at)) "
                "FROM requests"
            ).fetchone()  # type: ignore[misc]
            # Per-batch costs are spread over the batch: its size says how thinly.
            nbatches, mean_size, p50_size = conn.execute(
                "SELECT count(*), avg(size), "
                "percentile_disc(0.5) WITHIN GROUP (ORDER BY size) FROM batches"
            ).fetchone()  # type: ignore[misc]
            reasons: dict[str, int] = dict(
                conn.execute("SELECT reason, count(*) FROM batches GROUP BY 1").fetchall()
            )
            # Where a row's time went inside the scheduler (median ms): waiting to be
            # batched, between batching and compute (dispatch, the worker socket),
            # between compute and commit (the persist queue and the write).
            stages = conn.execute(
                "SELECT "
                + ", ".join(
                    f"percentile_cont(0.5) WITHIN GROUP (ORDER BY "
                    f"extract(epoch FROM {b} - {a}) * 1000)"
                    for a, b in (
                        ("consumed_at", "batched_at"),
                        ("batched_at", "compute_start_at"),
                        ("compute_end_at", "persisted_at"),
                    )
                )
                + " FROM requests"
            ).fetchone()
            assert stages is not None
        result = {
            "kind": args.kind,
            "rows": args.rows,
            "rows_stored": int(exact),
            "workers": args.workers,
            "durable": not args.fast,
            "env": extra,
            "produce_s": round(made["produce_s"], 1),
            "drain_s": round(samples[-1]["t"] - t0, 1),
            "persisted_span_rows_per_s": round(int(exact) / float(span), 1) if span else None,
            "steady": steady(samples, args.rows),
            "batches": {
                "count": int(nbatches),
                "mean_size": round(float(mean_size or 0), 1),
                "p50_size": p50_size,
                "reasons": reasons,
            },
            "stage_p50_ms": dict(
                zip(("batch_wait", "to_compute", "to_commit"), map(float, stages), strict=True)
            ),
            "scheduler_thread_cpu_s": {
                k: round(v - threads_before.get(k, 0.0), 2)
                for k, v in sorted(threads_after.items(), key=lambda kv: -kv[1])
            },
            "announcements": {"notes": listener.notes, "bytes": listener.bytes},
            "machine": machine(),
        }
        if profile:
            result["profile"] = profile
        return result
    except BaseException:
        log = workdir / "scheduler.log"
        if log.exists():
            print("--- scheduler.log (tail) ---", file=sys.stderr)
            print("\n".join(log.read_text().splitlines()[-60:]), file=sys.stderr)
        raise
    finally:
        stack.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--kind", choices=("sync", "job"), default="sync")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--fast", action="store_true", help="fsync and synchronous_commit off")
    ap.add_argument("--profile", type=int, default=0, help="py-spy the scheduler S seconds")
    ap.add_argument("--profile-mode", choices=("gil", "wall"), default="gil")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the scheduler")
    ap.add_argument("--out", type=Path, help="folder for persist-<kind>[-<label>].json")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    result = run(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        name = f"persist-{args.kind}{'-' + args.label if args.label else ''}.json"
        (args.out / name).write_text(text + "\n")


if __name__ == "__main__":
    main()
