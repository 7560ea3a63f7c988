"""What the scheduler tells the others, periodically: two loops, each its own thread.

* The heartbeat, four times a second: the load report for the API's admission (what
  the live workers can do, what is queued, the generation engine's KV cache), once a
  second the metrics window for the dashboard and the cancelled jobs read back, every
  five seconds the versions the workers serve announced to the registry.
* The model loop, every second or when a worker's state changes: the registry read
  (what to load, the specs intake keys batches by), every engine moved toward it
  (load and unload commands), each version's readiness reported, and every five
  seconds the measured cost curves per worker class.

PostgreSQL being away costs a report, never the loop: the next pass reports again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial

from sqlalchemy import Connection
from sqlalchemy import Engine as Database

from core.models.readiness import Readiness
from results import modelregistry
from results.faults import first_line
from results.jobs import cancelled_unfinished_stmt
from results.load import forget_scheduler, publish_scheduler_metrics, report_scheduler
from results.modelregistry import record_from_row, versions_stmt
from scheduler.runtime import metrics
from scheduler.runtime.engines import RequestEngine
from scheduler.runtime.host import CoreHost, Curves
from scheduler.runtime.lane import ConsumerLane, held_lag

log = logging.getLogger(__name__)

# Load reports four times a second: admission decides on them, and a stale view lets
# a burst through for its whole age (docs/decisions/0008).
LOAD_REPORT_S = 0.25
CANCELLED_REFRESH_S = 1.0
METRICS_PUBLISH_S = 1.0  # the dashboard's step (core/metrics_window.py)
ANNOUNCE_S = 5.0
# The registry is read, and each version's readiness reported, this often (s): a promote
# or a canary reaches the workers within it, and the API treats readiness older than
# results.modelregistry.READINESS_STALE_S (5 s) as gone.
REGISTRY_REFRESH_S = 1.0


def every(ticks: int, period_s: float, tick_s: float) -> bool:
    """Whether the ``ticks``-th tick of ``tick_s`` is one of those every ``period_s``."""
    return ticks % round(period_s / tick_s) == 0


class Reports:
    def __init__(
        self,
        scheduler_id: str,
        host: CoreHost,
        engines: Sequence[RequestEngine],
        lanes: Sequence[ConsumerLane],
        db: Database,
        stopping: threading.Event,
    ):
        self.scheduler_id = scheduler_id
        self.host = host
        self.engines = list(engines)
        self.lanes = list(lanes)
        self.db = db
        self.stopping = stopping
        self.models_changed = threading.Event()  # a worker reported: the model loop runs now

    def worker_ready(self) -> None:
        """A worker said hello: its versions are announced now, and the model loop runs."""
        self.models_changed.set()
        self.announce()

    # ---- the heartbeat -----------------------------------------------------------------
    def heartbeat_loop(self) -> None:
        ticks = 0
        while not self.stopping.wait(LOAD_REPORT_S):
            ticks += 1
            self.report_load(publish=every(ticks, METRICS_PUBLISH_S, LOAD_REPORT_S))
            if every(ticks, CANCELLED_REFRESH_S, LOAD_REPORT_S):
                self.refresh_cancelled()
            if every(ticks, ANNOUNCE_S, LOAD_REPORT_S):
                self.announce()

    def report_load(self, *, publish: bool = False) -> None:
        """Capacity and backlog for the API's admission control; with ``publish``, this
        scheduler's metrics window for the dashboard too."""
        report = self.host.load(held_lag(self.lanes))
        for engine in self.engines:
            engine.report(report)
        # Read outside the lock above: the window's gauges take it themselves.
        window = metrics.window(time.time()) if publish else None

        def write(conn: Connection) -> None:
            report_scheduler(conn, self.scheduler_id, report)
            if window is not None:
                publish_scheduler_metrics(conn, self.scheduler_id, window)

        self._write("load report", write)

    def refresh_cancelled(self) -> None:
        try:
            with self.db.connect() as conn:
                rows = conn.execute(cancelled_unfinished_stmt())
                ids = frozenset((str(r[0]), int(r[1])) for r in rows)
        except Exception as exc:
            log.warning("cancelled-jobs refresh failed: %s", first_line(exc))
            return
        self.host.set_cancelled(ids)

    def announce(self) -> None:
        """The versions live workers serve, with their batch limits and curves."""
        live = [a for engine in self.engines for a in engine.announced()]

        def write(conn: Connection) -> None:
            for a in live:
                modelregistry.announce(conn, *a.ref, a.max_batch, a.profile_ms)

        self._write("model announce", write)

    # ---- the model loop ----------------------------------------------------------------
    def model_loop(self) -> None:
        """Read the registry, move the workers toward it, report readiness."""
        ticks = 0
        while not self.stopping.is_set():
            self.models_changed.wait(REGISTRY_REFRESH_S)
            self.models_changed.clear()
            ticks += 1
            self.read_registry()
            readiness: list[Readiness] = [r for e in self.engines for r in e.refresh()]
            curves = self.host.class_curves() if every(ticks, ANNOUNCE_S, 1.0) else {}
            self._write("readiness report", partial(self._readiness, readiness, curves))

    def _readiness(self, readiness: list[Readiness], curves: Curves, conn: Connection) -> None:
        modelregistry.report_readiness(conn, self.scheduler_id, readiness)
        for (ref, cls), (limit, profile, n) in curves.items():
            modelregistry.report_curve(conn, *ref, cls, limit, profile, n)

    def read_registry(self) -> None:
        try:
            with self.db.connect() as conn:
                rows = conn.execute(versions_stmt()).all()
        except Exception as exc:  # keep what was read last; the built-ins before that
            log.warning("model registry read failed: %s", first_line(exc))
            return
        records = [record_from_row(r) for r in rows]
        previous = {r.name: r.previous_live for r in rows if r.previous_live}
        self.host.set_registry(records, previous)

    # ---- stopping ------------------------------------------------------------------------
    def withdraw(self) -> None:
        """Stop counting toward capacity at once rather than after the staleness window."""

        def write(conn: Connection) -> None:
            forget_scheduler(conn, self.scheduler_id)
            modelregistry.forget_readiness(conn, self.scheduler_id)

        self._write("withdrawing the load report", write)

    def _write(self, what: str, write: Callable[[Connection], None]) -> None:
        """``write(conn)`` in one transaction; PostgreSQL away: logged, the next pass
        writes again."""
        try:
            with self.db.begin() as conn:
                write(conn)
        except Exception as exc:
            log.warning("%s failed: %s", what, first_line(exc))
