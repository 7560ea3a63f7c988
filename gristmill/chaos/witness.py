"""The durability ledger as the chaos run's second witness (decision 54).

The audit compares what the clients were told with PostgreSQL. The ledger starts from
the other end: what Kafka holds as accepted for the run's tenants, each reconciled
against its terminal row. After the audit a reconciler runs until it has read past the
run; the witness then holds when nothing is missing, nothing pending, and Kafka holds at
least what the clients were told was accepted (more is allowed: a request can be durable
while its client saw only a broken connection).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from core.config import Settings
from gristmill.chaos.ledger import JobOutcome, Outcome
from gristmill.ledger.policy import complete
from gristmill.ledger.reconciler import Reconciler, ledger_group
from results import ledger as sql
from results.db import make_engine

log = logging.getLogger(__name__)


@dataclass
class Witness:
    accepted: int = 0  # requests Kafka holds for the run's tenants
    terminal: int = 0
    missing: int = 0
    pending: int = 0
    duplicates: int = 0
    complete: bool = False  # the ledger read past the run in time
    client_accepted: int = 0  # 200/504 answers and the items of 202 jobs
    missing_ids: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def failed(self) -> bool:
        """A definite contradiction: something missing, or, once the ledger has read
        everything, fewer requests in Kafka than clients were told were accepted."""
        if self.missing:
            return True
        return self.complete and (self.pending > 0 or self.accepted < self.client_accepted)

    def line(self) -> str:
        if self.error:
            return f"ledger (second witness): not read: {self.error}"
        verdict = "FAIL" if self.failed else ("ok" if self.complete else "incomplete")
        text = (
            f"ledger (second witness): {self.accepted} accepted in Kafka, {self.terminal} "
            f"terminal, {self.missing} missing, {self.pending} pending, {self.duplicates} "
            f"duplicate copies; clients were told {self.client_accepted} accepted: {verdict}"
        )
        if self.missing_ids:
            text += f"; missing: {', '.join(self.missing_ids[:10])}"
        return text


def client_accepted(outcomes: Iterable[Outcome], jobs: Iterable[JobOutcome]) -> int:
    return sum(o.accepted for o in outcomes) + sum(len(j.inputs) for j in jobs if j.accepted)


def tally(exports: Iterable[sql.Export], settled: bool, told: int) -> Witness:
    w = Witness(complete=settled, client_accepted=told)
    for e in exports:
        w.accepted += e.accepted
        w.terminal += e.terminal
        w.missing += e.missing
        w.pending += e.pending
        w.duplicates += e.duplicate
        w.missing_ids += e.missing_ids
    return w


def witness(
    settings: Settings,
    tenant_ids: list[str],
    since: float,
    told: int,
    timeout_s: float = 90.0,
) -> Witness:
    """Run a reconciler until it has read past now (or ``timeout_s``), then export the
    tenants' counts from ``since`` on."""
    until = time.time()
    lo = datetime.fromtimestamp(since, UTC).replace(second=0, microsecond=0)
    hi = datetime.fromtimestamp(until, UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
    stop = threading.Event()
    engine = make_engine(settings.database_url, pool_size=1)
    thread: threading.Thread | None = None
    try:
        rec = Reconciler(settings)
        thread = threading.Thread(target=rec.run, args=(stop,), name="ledger", daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout_s
        produce_s = settings.produce_timeout_ms / 1000
        group = ledger_group(settings)
        while True:
            with engine.connect() as conn:
                exports = [sql.export(conn, group, t, lo, hi) for t in tenant_ids]
            # Read past the run's end (not the export period's: nothing comes after it).
            done = bool(exports) and complete(exports[0].settled_through, until, produce_s)
            if (done and all(e.pending == 0 for e in exports)) or time.monotonic() > deadline:
                return tally(exports, done, told)
            time.sleep(1.0)
    except Exception as exc:  # a witness that cannot testify says so; it fails nothing
        log.exception("the ledger witness failed")
        return Witness(client_accepted=told, error=f"{type(exc).__name__}: {exc}")
    finally:
        stop.set()
        if thread is not None:
            thread.join(30)  # its last store and its consumer's leave, before services stop
        engine.dispose()
