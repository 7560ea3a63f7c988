"""The sweeper: keeps the log tables cut into partitions and within their retention.

Every scheduler runs one; a session-level advisory lock makes one of them the leader
and the others wait (if the leader's process or connection dies, PostgreSQL frees the
lock and the next attempt of another takes over). ``gristmill sweep`` runs one
pass by hand. A pass, in this order:

1. job outputs past ``output_expires_at`` (once the job is finished or its window has
   closed), and jobs older than their tenant's retention: their result rows and items
   are deleted in small batches and ``output_expired_at`` is set; jobs older than
   retention are then deleted;
2. the rows of tenants whose retention is shorter than what the partitions keep;
3. Idempotency-Keys older than their time to live (sync claims deleted, jobs' keys
   freed), uploaded files past their ``expires_at`` (their chunks, then the files;
   decision 42), and batch rows older than the longest retention;
4. partitions: made ``ahead`` of now, and dropped whole once older than the longest
   retention (results/partitions.py), only after steps 1-3 caught up, so a job's items
   never outlive the partition its results would go to.

Each DELETE takes at most ``sweep_batch_rows`` rows in its own short transaction, so a
writer never waits long behind it; a pass stops deleting after ``sweep_budget_s`` and
the next one carries on. What is due is decided in results/retention.py.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, text

from core.config import Settings
from results import partitions
from results.faults import first_line
from results.retention import (
    PARTITIONED,
    Layout,
    keep_for,
    row_cutoffs,
    to_create,
    to_drop,
)

log = logging.getLogger(__name__)

# The advisory lock whose holder is the sweeper ("gmsw").
LEADER_LOCK = 0x676D7377


@dataclass
class SweepReport:
    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    jobs_expired: int = 0
    jobs_deleted: int = 0
    rows_deleted: int = 0
    idempotency_keys: int = 0
    files_deleted: int = 0
    caught_up: bool = True  # False: the time budget ran out with rows still due
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# Each selects at most :n keys of due rows; the DELETE around it removes them.
_DELETE_BY_KEYS = """
    DELETE FROM {table} t USING ({select}) d
    WHERE t.request_id = d.request_id AND t.received_at = d.received_at"""
_JOB_ROWS = "SELECT request_id, received_at FROM requests WHERE job_id = :job LIMIT :n"
_TENANT_ROWS = (
    "SELECT request_id, received_at FROM {table} "
    "WHERE tenant_id = :tenant AND received_at < :cut LIMIT :n"
)
_OTHER_ROWS = (
    "SELECT request_id, received_at FROM {table} "
    "WHERE received_at < :cut AND tenant_id <> ALL(CAST(:explicit AS uuid[])) LIMIT :n"
)
_JOB_ITEMS = """
    DELETE FROM job_items WHERE job_id = :job AND item_index = ANY(ARRAY(
        SELECT item_index FROM job_items WHERE job_id = :job ORDER BY item_index LIMIT :n))"""
# Batches are not partitioned (a row per batch: a hundredth of the requests' at most).
_BATCHES = """
    DELETE FROM batches WHERE batch_id = ANY(ARRAY(
        SELECT batch_id FROM batches WHERE formed_at < :cut LIMIT :n))"""
_IDEMPOTENCY = """
    DELETE FROM idempotency_keys WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM idempotency_keys WHERE created_at < :cut LIMIT :n))"""
# A job's Idempotency-Key is freed (the job stays) once as old: a reused key is then a
# new job. The partial index jobs_idempotency_created finds them.
_JOB_KEYS = """
    UPDATE jobs SET idempotency_key = NULL WHERE job_id = ANY(ARRAY(
        SELECT job_id FROM jobs
        WHERE idempotency_key IS NOT NULL AND created_at < :cut LIMIT :n))"""
# Uploaded files past their expiry (already gone for their tenant): chunks first, a few
# at a time (each up to 1 MiB, results/files.py), then the files that have none left.
_FILE_CHUNKS = """
    DELETE FROM stored_file_chunks c USING (
        SELECT k.file_id, k.seq FROM stored_file_chunks k
        JOIN stored_files f ON f.file_id = k.file_id
        WHERE f.expires_at <= :now LIMIT :n) d
    WHERE c.file_id = d.file_id AND c.seq = d.seq"""
_FILES = """
    DELETE FROM stored_files WHERE file_id = ANY(ARRAY(
        SELECT file_id FROM stored_files WHERE expires_at <= :now LIMIT :n))"""
# Chunks one DELETE takes: 64 MiB at most, a short transaction like the others'.
FILE_CHUNKS_PER_DELETE = 64
# Jobs whose output is due: past output_expires_at, or older than their tenant's
# retention; either way only once no item can still run (finished, or window closed).
_DUE_JOBS = text("""
    SELECT j.job_id,
           j.created_at < :now - make_interval(days => coalesce(t.log_retention_days, :days))
               AS past_retention
    FROM jobs j LEFT JOIN tenants t ON t.id = j.tenant_id
    WHERE coalesce(j.finished_at, j.expires_at) <= :now
      AND ((j.output_expired_at IS NULL AND j.output_expires_at <= :now)
           OR j.created_at < :now - make_interval(days => coalesce(t.log_retention_days, :days)))
    ORDER BY j.created_at
    LIMIT 100""")


class Sweeper:
    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
    ):
        self.engine = engine
        self.s = settings
        self.clock = clock
        self.layout = Layout(
            interval=timedelta(hours=settings.request_log_partition_hours),
            ahead=timedelta(hours=settings.request_log_ahead_hours),
        )
        self._leader: Connection | None = None

    # ---- leadership ------------------------------------------------------------------
    def try_lead(self) -> bool:
        """Whether this instance is the leader (taking the lock if it is free). The lock
        lives as long as this instance's dedicated connection."""
        if self._leader is not None:
            try:
                self._leader.execute(text("SELECT 1"))
                return True
            except Exception as exc:
                log.warning("sweeper lost its leader connection: %s", first_line(exc))
                self.release()
        conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": LEADER_LOCK})
            if got.scalar():
                self._leader = conn
                log.info("this instance sweeps the log tables")
                return True
        except Exception:
            conn.close()
            raise
        conn.close()
        return False

    def release(self) -> None:
        if self._leader is not None:
            with contextlib.suppress(Exception):
                # Closed, not returned to the pool (where its session, and so the lock,
                # would live on): the session ends and PostgreSQL frees the lock.
                self._leader.invalidate()
                self._leader.close()
            self._leader = None

    def run(self, stopping: threading.Event) -> None:
        """Sweep every ``sweep_interval_s`` while leader, until ``stopping``."""
        while not stopping.is_set():
            try:
                if self.try_lead():
                    report = self.sweep()
                    if report.created or report.dropped or report.rows_deleted:
                        log.info("sweep: %s", report.as_dict())
            except Exception as exc:  # PostgreSQL away: try again next time
                log.warning("sweep failed: %s", first_line(exc))
            stopping.wait(self.s.sweep_interval_s)
        self.release()

    # ---- one pass ----------------------------------------------------------------------
    def sweep(self, now: datetime | None = None) -> SweepReport:
        now = now or datetime.fromtimestamp(self.clock(), UTC)
        report = SweepReport()
        deadline = time.monotonic() + self.s.sweep_budget_s
        tenant_days = self._tenant_retention()
        self._expire_jobs(now, report, deadline)
        self._tenant_rows(now, tenant_days, report, deadline)
        self._idempotency(now, report, deadline)
        self._files(now, report, deadline)
        keep = keep_for(self.s.request_log_retention_days, list(tenant_days.values()))
        n, done = self._batches(_BATCHES, {"cut": now - keep}, deadline)
        report.rows_deleted += n
        report.caught_up &= done
        self._partitions(now, keep, report)
        return report

    def _tenant_retention(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT id, log_retention_days FROM tenants WHERE log_retention_days > 0")
            )
            return {str(r[0]): int(r[1]) for r in rows}

    def _batches(
        self, sql: str, params: dict[str, Any], deadline: float, rows: int | None = None
    ) -> tuple[int, bool]:
        """Run a batched DELETE (``rows`` a statement, else ``sweep_batch_rows``) until
        nothing is left (True) or the time is up (False)."""
        total = 0
        stmt = text(sql)
        rows = rows or self.s.sweep_batch_rows
        params = {**params, "n": rows}
        while True:
            with self.engine.begin() as conn:
                n = conn.execute(stmt, params).rowcount or 0
            total += n
            if n < rows:
                return total, True
            if time.monotonic() > deadline:
                return total, False

    def _expire_jobs(self, now: datetime, report: SweepReport, deadline: float) -> None:
        days = self.s.request_log_retention_days
        while time.monotonic() < deadline:
            with self.engine.connect() as conn:
                due = conn.execute(_DUE_JOBS, {"now": now, "days": days}).all()
            if not due:
                return
            for job_id, past_retention in due:
                job = {"job": str(job_id)}
                n, done = self._batches(
                    _DELETE_BY_KEYS.format(table="requests", select=_JOB_ROWS), job, deadline
                )
                report.rows_deleted += n
                if done:
                    _, done = self._batches(_JOB_ITEMS, job, deadline)
                if not done:
                    report.caught_up = False
                    return
                with self.engine.begin() as conn:
                    if past_retention:
                        conn.execute(text("DELETE FROM jobs WHERE job_id = :job"), job)
                        report.jobs_deleted += 1
                    else:
                        conn.execute(
                            text(
                                "UPDATE jobs SET output_expired_at = now() "
                                "WHERE job_id = :job AND output_expired_at IS NULL"
                            ),
                            job,
                        )
                        report.jobs_expired += 1

    def _tenant_rows(
        self, now: datetime, tenant_days: dict[str, int], report: SweepReport, deadline: float
    ) -> None:
        cuts = row_cutoffs(now, self.s.request_log_retention_days, tenant_days)
        work: list[tuple[str, dict[str, Any]]] = []
        for table in ("requests", "answer_timeouts"):
            for tenant, cut in cuts.tenants.items():
                select = _TENANT_ROWS.format(table=table)
                work.append(
                    (
                        _DELETE_BY_KEYS.format(table=table, select=select),
                        {"tenant": tenant, "cut": cut},
                    )
                )
            if cuts.others is not None:
                select = _OTHER_ROWS.format(table=table)
                work.append(
                    (
                        _DELETE_BY_KEYS.format(table=table, select=select),
                        {"cut": cuts.others, "explicit": sorted(cuts.explicit)},
                    )
                )
        for sql, params in work:
            n, done = self._batches(sql, params, deadline)
            report.rows_deleted += n
            if not done:
                report.caught_up = False
                return
        # Refusal counts: few rows, deleted in one statement per tenant.
        with self.engine.begin() as conn:
            for tenant, cut in cuts.tenants.items():
                conn.execute(
                    text("DELETE FROM refusals WHERE tenant_id = :t AND at < :cut"),
                    {"t": tenant, "cut": cut},
                )
            if cuts.others is not None:
                conn.execute(
                    text(
                        "DELETE FROM refusals WHERE at < :cut AND (tenant_id IS NULL OR "
                        "tenant_id <> ALL(CAST(:explicit AS uuid[])))"
                    ),
                    {"cut": cuts.others, "explicit": sorted(cuts.explicit)},
                )

    def _idempotency(self, now: datetime, report: SweepReport, deadline: float) -> None:
        cut = now - timedelta(hours=self.s.idempotency_ttl_h)
        for sql in (_IDEMPOTENCY, _JOB_KEYS):
            n, done = self._batches(sql, {"cut": cut}, deadline)
            report.idempotency_keys += n
            report.caught_up &= done

    def _files(self, now: datetime, report: SweepReport, deadline: float) -> None:
        _, done = self._batches(_FILE_CHUNKS, {"now": now}, deadline, FILE_CHUNKS_PER_DELETE)
        if done:
            n, done = self._batches(_FILES, {"now": now}, deadline)
            report.files_deleted += n
        report.caught_up &= done

    def _partitions(self, now: datetime, keep: timedelta, report: SweepReport) -> None:
        with self.engine.begin() as conn:
            existing, pending = partitions.list_partitions(conn, list(PARTITIONED))
        for table, name in pending:  # a detach interrupted earlier: finish it
            if self._ddl(report, partitions.drop, self.engine, table, name, finalize=True):
                report.dropped.append(name)
        for table, key in PARTITIONED.items():
            for slot in to_create(table, now, existing, self.layout):
                if self._ddl(report, partitions.create, self.engine, slot, key):
                    report.created.append(slot.name)
        if not report.caught_up:
            return  # rows due before the drop are not all gone yet
        for p in to_drop(now, existing, keep):
            if self._ddl(report, partitions.drop, self.engine, p.table, p.name):
                report.dropped.append(p.name)

    @staticmethod
    def _ddl(report: SweepReport, change: Callable[..., None], *args: Any, **kw: Any) -> bool:
        try:
            change(*args, **kw)
            return True
        except Exception as exc:  # a lock not granted in time: next pass
            report.errors.append(first_line(exc))
            log.warning("partition change deferred: %s", first_line(exc))
            return False
