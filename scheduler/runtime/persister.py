"""The persist path: the core's planned writes into PostgreSQL, then their offsets.

A small priority pool runs the writes, sync results first (one thread only ever
writes sync results, so a sync row never waits behind a job batch's write), and job
writes step aside while commits are slow (scheduler/core/write_yield.py). Each
write builds its rows in the pool thread (the receiver is free for the next result),
stores them in one transaction, and only then reports the offsets done, so a commit
never passes unsaved work.

A failed write is classified (results/faults.py): a transient fault is retried with
backoff; rows PostgreSQL refuses are isolated by splitting the write in halves until
each offending row is alone, and that row is copied to the dead-letter topic and
stored as a failed row it can hold, so one bad row never pins a thread or its
partition's offsets (docs/decisions/0019-bad-rows-and-bad-messages.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    retry_if_result,
    wait_random_exponential,
)

from core.request_row import RequestRow
from core.vocab import RequestStatus
from results.faults import Fault, classify, first_line
from scheduler.core.batcher import Pending
from scheduler.core.offsets import TopicPartition
from scheduler.core.plans import BACKGROUND_RANK, Reject, Write
from scheduler.core.write_yield import WriteYield
from scheduler.runtime import metrics, tracing
from scheduler.runtime.deadletter import DeadLetterSink, Letter, letter_for, source_headers
from scheduler.runtime.priority_pool import PriorityPool
from scheduler.runtime.rows import unstorable, write_rows
from scheduler.runtime.supervisor import Supervisor

log = logging.getLogger(__name__)

Row = dict[str, Any]  # a batch row
# Writes request rows and the rows of the batches they ran in, in one transaction.
Store = Callable[[list[RequestRow], list[Row]], object]
OnDone = Callable[[list[tuple[TopicPartition, int]], int], None]

# Retries of a transient fault: exponential from 50 ms, at most 1 s apart, so a write
# resumes within a second of PostgreSQL coming back.
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 1.0
# Once stopping, a write gives up after this many tries: its offsets stay uncommitted
# and the partition's next owner reads the work again.
STOPPING_TRIES = 3
# Threads kept for sync results, of the ``persist_threads`` writing results.
SYNC_ONLY = 1
# Most request rows one transaction holds when a write takes on the writes queued behind
# it (group commit). A commit costs a flush of the WAL to disk, and the writes of one
# job (its counters' row lock) commit one at a time (sync results' announcements wait
# for no flush since decision 70), so under a backlog rows/s is rows a commit over the
# disk's flush time: merging queued
# writes makes the backlog itself raise rows a commit. Four of the largest batches a
# worker takes (1,024 on a GPU) keep one transaction's insert well under a second.
MERGE_ROWS = 4096


class _Refused(Exception):
    """PostgreSQL (or the driver) refuses these rows' values (``Fault.DATA``)."""


class Persister:
    def __init__(
        self,
        store: Store,
        dead_letters: DeadLetterSink,
        on_done: OnDone,
        stopping: threading.Event,
        *,
        supervisor: Supervisor | None = None,
        threads: int = 3,
    ):
        self.store = store
        self.dead_letters = dead_letters
        self.on_done = on_done
        self.stopping = stopping
        # Job writes step aside while commits are slow (scheduler/core/write_yield.py).
        self.pace = WriteYield()
        self.pool = PriorityPool(
            threads,
            name="persist",
            reserved=SYNC_ONLY,
            background_from=BACKGROUND_RANK,
            supervisor=supervisor,
            hold_background=lambda busy, running: self.pace.hold_job(
                time.monotonic(), sync_busy=busy, jobs_running=running
            ),
        )

    def submit(self, plans: Iterable[Write | Reject]) -> None:
        for plan in plans:
            if isinstance(plan, Write):
                self.pool.submit(plan.priority, self.write, plan)
            else:
                self.pool.submit(plan.priority, self.reject, plan)

    def pending(self) -> int:
        return self.pool.pending()

    def shutdown(self) -> None:
        """Run what is queued, then stop."""
        self.pool.shutdown(wait=True)

    # ---- in the pool's threads ---------------------------------------------------------
    def write(self, w: Write) -> None:
        """Store ``w``, with the like writes queued behind it if any (one commit)."""
        if _mergeable(w):
            room = MERGE_ROWS - len(w.items)

            def fits(x: Write | Reject) -> bool:
                nonlocal room
                if not isinstance(x, Write) or not _mergeable(x) or len(x.items) > room:
                    return False
                room -= len(x.items)
                return True

            more = [args[0] for args in self.pool.take_while(w.priority, self.write, fits)]
            if more:
                self._write_merged([w, *more])
                return
        self._write_one(w)

    def _write_merged(self, ws: list[Write]) -> None:
        """Several computed batches' rows in one transaction; if PostgreSQL refuses any
        row, each write is stored on its own (which isolates the row)."""
        parts: list[tuple[Write, list[RequestRow], Row | None]] = []
        for w in ws:
            try:
                rows, brow = write_rows(w)
            except Exception:  # that write's own path records it as failed
                self._write_one(w)
                continue
            parts.append((w, rows, brow))
        rows = [r for _, rs, _ in parts for r in rs]
        brows = [b for _, _, b in parts if b is not None]
        try:
            if not self._store(rows, brows):
                return  # stopping: offsets stay uncommitted
        except _Refused:
            for w, _, _ in parts:
                self._write_one(w)
            return
        metrics.merged_writes(len(parts))
        for w, rs, _ in parts:
            self._stored(w, rs)

    def _write_one(self, w: Write) -> None:
        if w.dead_letter and not self._letters([letter_for(p, w.error or "") for p in w.items]):
            return
        metrics.dead_lettered(w.items if w.dead_letter else [])
        try:
            rows, brow = write_rows(w)
        except Exception as exc:  # a worker's answer that cannot become rows
            log.exception("results of batch %s cannot be recorded", w.batch and w.batch.batch_id)
            error = f"the result could not be recorded: {first_line(exc)}"
            failed = Write(
                w.priority, RequestStatus.FAILED, w.items, error, w.batch, dead_letter=True
            )
            self._write_one(failed)
            return
        if not self._store_isolating(rows, w.items, brow, lettered=w.dead_letter):
            return  # stopping: offsets stay uncommitted
        self._stored(w, rows)

    def _stored(self, w: Write, rows: list[RequestRow]) -> None:
        """``w``'s rows are committed: its offsets are done, and what waited on it runs."""
        metrics.persisted(rows)
        tracing.finished(w.batch, w.compute)
        self.on_done([(p.tp, p.offset) for p in w.items], len(rows))
        if w.then is not None:
            self.pool.submit(w.then.priority, self.write, w.then)

    def reject(self, r: Reject) -> None:
        log.error("unreadable message at %s[%d]@%d: %s", r.tp[0], r.tp[1], r.offset, r.reason)
        letter = Letter(None, r.value, source_headers(r.reason, r.tp, r.offset))
        if not self._letters([letter]):
            return
        rows = [r.row] if r.row is not None else []
        if rows and not self._store_isolating(rows, [None], None, lettered=True):
            return
        self.on_done([(r.tp, r.offset)], len(rows))

    # ---- storing -------------------------------------------------------------------------
    def _store_isolating(
        self,
        rows: list[RequestRow],
        items: Sequence[Pending | None],
        brow: Row | None,
        *,
        lettered: bool,
    ) -> bool:
        """Store ``rows`` (and the batch row); rows refused for their values are stored as
        failed rows alone. False if stopping first."""
        parts = [(rows, items, brow)]
        while parts:
            rows, items, brow = parts.pop()
            try:
                if not self._store(rows, [] if brow is None else [brow]):
                    return False
                continue
            except _Refused as exc:
                refused = exc.__cause__ or exc
            if len(rows) + (brow is not None) > 1:
                parts.extend(reversed(_halves(rows, items, brow)))  # first half first
            elif brow is not None:
                self._store_batch_row(brow, refused)
            elif not self._store_unstorable(rows[0], items[0], refused, lettered=lettered):
                return False
        return True

    def _store_unstorable(
        self, row: RequestRow, item: Pending | None, refused: BaseException, *, lettered: bool
    ) -> bool:
        error = first_line(refused)
        log.error("request %s: its row cannot be stored: %s", row.get("request_id"), error)
        letter = f"the result could not be stored: {error}"
        if item is not None and not lettered and not self._letters([letter_for(item, letter)]):
            return False
        try:
            return self._store([cast(RequestRow, unstorable(row, error))], [])
        except _Refused as again:  # its message is in the dead-letter topic: move on
            log.error("request %s: no row at all: %s", row.get("request_id"), first_line(again))
            return True

    def _store_batch_row(self, brow: Row, refused: BaseException) -> None:
        try:
            self._store([], [unstorable(brow, first_line(refused))])
        except _Refused as again:  # the batch's requests have their rows: only logged
            log.error("batch %s: no row: %s", brow.get("batch_id"), first_line(again))

    def _store(self, rows: list[RequestRow], brows: list[Row]) -> bool:
        """One transaction, retried while the fault is not the rows'; ``_Refused`` if it is,
        False if stopping first."""
        try:
            sync = any(r["job_id"] is None for r in rows)
            for attempt in self._retrying(retry_if_exception(_not_refused)):
                with attempt:
                    try:
                        self._timed(rows, brows, sync)
                    except Exception as exc:
                        if classify(exc) is Fault.DATA:
                            raise _Refused(first_line(exc)) from exc
                        raise
        except _Stopped:
            return False  # Kafka redelivers this work to the next owner
        return True

    def _timed(self, rows: list[RequestRow], brows: list[Row], sync: bool) -> None:
        """One attempt at the write; a sync write's time goes to the pace."""
        if not sync:
            self.store(rows, brows)
            return
        t0 = time.monotonic()
        self.pace.sync_started(t0)
        try:
            self.store(rows, brows)
        except BaseException:
            self.pace.sync_failed()
            raise
        self.pace.sync_finished(time.monotonic() - t0)

    def _letters(self, letters: list[Letter]) -> bool:
        """Dead-letter copies, retried until confirmed; False if stopping first."""
        try:
            for attempt in self._retrying(retry_if_result(lambda sent: not sent)):
                with attempt:
                    sent = self.dead_letters.send(letters)
                outcome = attempt.retry_state.outcome
                if outcome is not None and not outcome.failed:
                    attempt.retry_state.set_result(sent)
        except _Stopped:
            return False
        return True

    def _retrying(self, retry: Any) -> Retrying:
        """Retries with full-jitter exponential backoff, forever, unless stopping."""

        def stop(state: RetryCallState) -> bool:
            if self.stopping.is_set() and state.attempt_number >= STOPPING_TRIES:
                raise _Stopped
            return False

        return Retrying(
            retry=retry,
            stop=stop,
            wait=wait_random_exponential(multiplier=RETRY_FIRST_S, max=RETRY_MAX_S),
            before_sleep=_log_retry,
            reraise=True,
        )


class _Stopped(Exception):
    """Stopping, and a write or a dead-letter copy kept failing: leave it to Kafka."""


def _mergeable(w: Write) -> bool:
    """Computed results with nothing to do before their write (no dead-letter copies)."""
    return w.status == RequestStatus.SUCCEEDED and not w.dead_letter


def _not_refused(exc: BaseException) -> bool:
    return not isinstance(exc, _Refused)


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    if exc is None:
        log.warning("dead-letter copies not confirmed (attempt %d)", state.attempt_number)
        return
    fault = classify(exc)
    metrics.persist_retried()
    log.log(
        logging.WARNING if fault is Fault.TRANSIENT else logging.ERROR,
        "persist failed (%s, attempt %d): %s",
        fault,
        state.attempt_number,
        first_line(exc),
    )


def _halves(
    rows: list[RequestRow], items: Sequence[Pending | None], brow: Row | None
) -> list[tuple[list[RequestRow], Sequence[Pending | None], Row | None]]:
    """Split a refused write in two; the batch row goes with the first part, or alone."""
    if len(rows) <= 1:
        return [(rows, items, None), ([], [], brow)]
    mid = len(rows) // 2
    return [(rows[:mid], items[:mid], brow), (rows[mid:], items[mid:], None)]
