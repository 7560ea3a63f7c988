"""The system a long run drives, shaped as ``gristmill dev`` shapes it: PostgreSQL that
flushes its commits (``gristmill dev``'s default, unlike the test suite's), Kafka, one API
instance of ``api_processes`` uvicorn processes and one scheduler with ``workers`` `sim`
workers; plus what the run reads back from it afterwards (refusals by reason, the sync
rows' persist times, Kafka lag, PostgreSQL's checkpoint log lines).
"""

from __future__ import annotations

import re
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition

from bench.jobs import write_jsonl
from core.kafka import consumer_config
from core.topics import all_request_topics
from gristmill.devservices.stack import System, build_system, local_services
from results.db import libpq_url


@contextmanager
def dev_like_system(
    *,
    prefix: str,
    api_processes: int = 2,
    workers: int = 2,
    sim_batch_ms: int = 100,
    partitions: int = 6,
    extra_env: dict[str, str] | None = None,
    keep: Path | None = None,
) -> Iterator[System]:
    """Started, serving `sim`, and torn down on exit. ``partitions`` per topic (``gristmill
    dev``'s 6). ``keep``: the work folder (logs) goes there instead of a temp folder that is
    removed."""
    with ExitStack() as stack:
        if keep is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
        else:
            work = keep
            work.mkdir(parents=True, exist_ok=True)
        services = stack.enter_context(local_services(work, external=False, durable=True))
        env = {"GRISTMILL_TOPIC_PARTITIONS": str(partitions), **(extra_env or {})}
        system = build_system(services, work, sim_batch_ms=sim_batch_ms, extra_env=env)
        with psycopg.connect(libpq_url(services.database_url), autocommit=True) as conn:
            # Every autovacuum run in the server's log: a slow moment can be one.
            conn.execute("ALTER SYSTEM SET log_autovacuum_min_duration = 0")
            conn.execute("SELECT pg_reload_conf()")
        stack.callback(system.close)
        system.start_scheduler(workers=workers, models="sim")
        system.url = system.start_api(processes=api_processes)
        system.wait_until_serving("sim")
        yield system


def dsn(system: System) -> str:
    return libpq_url(system.services.database_url)


def work_mem_mb(system: System) -> float:
    """The server's ``work_mem`` in MiB: what one sort or hash of a query may hold."""
    with psycopg.connect(dsn(system), autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_size_bytes(current_setting('work_mem'))::float / 1048576"
        ).fetchone()
    assert row is not None
    return float(row[0])


def side_dsn(system: System) -> str:
    """A database of its own on the same server, for the benchmark's competing writer
    and commit probe (their tables stay out of the system's sizes)."""
    url = dsn(system)
    with psycopg.connect(url, autocommit=True) as conn:
        if (
            conn.execute("SELECT 1 FROM pg_database WHERE datname = 'bench_side'").fetchone()
            is None
        ):
            conn.execute("CREATE DATABASE bench_side")
    return url.rsplit("/", 1)[0] + "/bench_side"


def roots(system: System) -> dict[str, int]:
    """The system's processes by name (each a root: its children are sampled too)."""
    out = {name: p.pid for name, p in system.procs.items() if p.poll() is None}
    pg = system.services.postgres
    if pg is not None and pg.pid is not None:
        out["postgres"] = pg.pid
    kafka = system.services.kafka
    if kafka is not None:
        for i in range(kafka.n_brokers):
            if (pid := kafka.pid(i)) is not None:
                out[f"kafka{i}"] = pid
    return out


class KafkaLag:
    """Messages not yet committed by the schedulers' groups, per request topic."""

    def __init__(self, system: System):
        s = system.settings
        self.topics = all_request_topics(s)
        self.groups = {t: s.consumer_group for t in self.topics}
        jobs = [t for t in self.topics if t.endswith(".jobs")]
        for t in jobs:
            self.groups[t] = f"{s.consumer_group}-jobs"
        self._consumers = {
            g: Consumer(consumer_config(s, g, **{"enable.auto.commit": False}))
            for g in set(self.groups.values())
        }
        self._partitions = s.topic_partitions

    def __call__(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for topic, group in self.groups.items():
            c = self._consumers[group]
            tps = [TopicPartition(topic, p) for p in range(self._partitions)]
            committed = c.committed(tps, timeout=10)
            behind = 0
            for tp in committed:
                lo, hi = c.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=10)
                at = tp.offset if tp.offset >= 0 else lo
                behind += max(0, hi - at)
            out[topic.rsplit(".", 1)[-1]] = behind
        return out

    def close(self) -> None:
        for c in self._consumers.values():
            c.close()


def refusals(system: System, t0: float, t1: float) -> list[dict[str, Any]]:
    """The API's own refusal counts (the request log's, ingest/edge/refusal_counts.py) by second."""
    with psycopg.connect(dsn(system), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM at)::bigint, status, reason, sum(count)::int FROM refusals"
            " WHERE at >= to_timestamp(%s) AND at < to_timestamp(%s) GROUP BY 1, 2, 3 ORDER BY 1",
            (t0, t1),
        ).fetchall()
    return [{"t": r[0], "status": r[1], "reason": r[2], "count": r[3]} for r in rows]


def persist_seconds(system: System, t0: float, t1: float) -> list[dict[str, Any]]:
    """Per second of ``persisted_at``: sync and job rows written, and the sync rows' time
    from compute end to the transaction's start (p50, p95, max, ms)."""
    with psycopg.connect(dsn(system), autocommit=True) as conn:
        rows = conn.execute(
            """
            SELECT extract(epoch FROM date_trunc('second', persisted_at))::bigint AS s,
                   count(*) FILTER (WHERE job_id IS NULL),
                   count(*) FILTER (WHERE job_id IS NOT NULL),
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM
                       persisted_at - compute_end_at) * 1000) FILTER (WHERE job_id IS NULL),
                   percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM
                       persisted_at - compute_end_at) * 1000) FILTER (WHERE job_id IS NULL),
                   max(extract(epoch FROM persisted_at - compute_end_at) * 1000)
                       FILTER (WHERE job_id IS NULL)
            FROM requests
            WHERE persisted_at >= to_timestamp(%s) AND persisted_at < to_timestamp(%s)
            GROUP BY 1 ORDER BY 1
            """,
            (t0, t1),
        ).fetchall()
    return [
        {
            "t": r[0],
            "sync_rows": r[1],
            "job_rows": r[2],
            "sync_persist_p50_ms": _round(r[3]),
            "sync_persist_p95_ms": _round(r[4]),
            "sync_persist_max_ms": _round(r[5]),
        }
        for r in rows
    ]


_STAGES = {
    "queue": "consumed_at - received_at",  # the API, Kafka, the scheduler's intake
    "batch_wait": "batched_at - consumed_at",
    "compute": "compute_end_at - compute_start_at",
    "to_compute": "compute_start_at - batched_at",  # dispatch to a free worker
    "persist": "persisted_at - compute_end_at",
}


def stage_seconds(system: System, t0: float, t1: float) -> list[dict[str, Any]]:
    """Per second of ``received_at``: the sync rows' p95 of each stage (ms), where a
    request's time went while it was late."""
    cols = ", ".join(
        f"percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM {expr}) * 1000)"
        for expr in _STAGES.values()
    )
    with psycopg.connect(dsn(system), autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT extract(epoch FROM date_trunc('second', received_at))::bigint, count(*), "
            f"{cols} FROM requests WHERE job_id IS NULL AND received_at >= to_timestamp(%s) "
            "AND received_at < to_timestamp(%s) GROUP BY 1 ORDER BY 1",
            (t0, t1),
        ).fetchall()
    out = []
    for r in rows:
        p95 = {f"{k}_p95_ms": _round(v) for k, v in zip(_STAGES, r[2:], strict=True)}
        out.append({"t": r[0], "rows": r[1], **p95})
    return out


def _round(v: float | None) -> float | None:
    return None if v is None else round(float(v), 1)


_CHECKPOINT = re.compile(
    r"^(\S+ \S+) \S+ \[\d+\] LOG:  checkpoint complete: .*?write=([\d.]+) s, "
    r"sync=([\d.]+) s, total=([\d.]+) s"
)


_AUTOVACUUM = re.compile(
    r"^(\S+ \S+) \S+ \[\d+\] LOG:  automatic (vacuum|analyze) of table \"([^\"]+)\""
)


def checkpoint_log(system: System) -> list[dict[str, Any]]:
    """PostgreSQL's own record of each checkpoint (log_checkpoints is on by default) and
    each autovacuum or autoanalyze run (when it ended)."""
    pg = system.services.postgres
    if pg is None or not pg.log_path.exists():
        return []
    out: list[dict[str, Any]] = []
    for line in pg.log_path.read_text(errors="replace").splitlines():
        m = _CHECKPOINT.match(line)
        if m:
            out.append(
                {"at": m[1], "write_s": float(m[2]), "sync_s": float(m[3]), "total_s": float(m[4])}
            )
        elif a := _AUTOVACUUM.match(line):
            out.append({"at": a[1], "auto": a[2], "table": a[3]})
    return out


__all__ = ["write_jsonl"]  # the job files long runs submit (bench/jobs.py's)


def new_tag() -> str:
    return uuid.uuid4().hex[:6]
