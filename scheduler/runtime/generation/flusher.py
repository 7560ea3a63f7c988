"""Generation's way to PostgreSQL: what the step loop's events become, in order.

The step loop (scheduler/runtime/generation/engine.py) hands each step's events here;
a flusher thread writes what the outbox (scheduler/core/generation/outbox.py) gathered,
in one transaction per flush: new tokens as progress rows, ended requests as their
request-log rows (the same writer as batches use, so waiters and jobs hear of them
alike), refused and failed requests as failed rows. Only then are their Kafka offsets
done: an accepted request is never committed before its row.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from core.request_row import RequestRow
from core.vocab import RequestStatus
from results.faults import first_line
from results.generation import write_flush
from results.store import settle_jobs
from scheduler.core.batcher import Pending
from scheduler.core.generation.events import Event, Failed, gap_summary
from scheduler.core.generation.outbox import Ending, Flush, Outbox
from scheduler.core.generation.requests import Prepared
from scheduler.core.generation.sequence import FinishReason
from scheduler.core.offsets import TopicPartition
from scheduler.runtime import metrics
from scheduler.runtime.rows import request_row
from scheduler.runtime.supervisor import Supervisor

log = logging.getLogger(__name__)

Done = Callable[[list[tuple[TopicPartition, int]], int], None]

# How long the flusher gathers before a write when the outbox is quiet (s): a step
# on this CPU takes 10-30 ms (docs/bench/generation.md), so a caller's token waits at
# most about one more step for its row.
FLUSH_WAIT_S = 0.01


def answer(e: Ending) -> dict[str, Any]:
    """A finished request's output in the request log: the text, why it ended, its
    token counts, and the text offset after each token (a stream that reconnects after
    the end resumes after the token it saw last)."""
    f = e.finished
    return {
        "text": f.text,
        "finish_reason": str(f.reason),
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": e.completion_tokens,
        "offsets": list(e.offsets),
        "time_to_first_token_ms": None
        if f.first_token_at is None
        else round((f.first_token_at - f.arrived_at) * 1000, 3),
        "preemptions": f.preemptions,
        "inter_token_ms": gap_summary(f.token_gaps),
    }


def final_row(p: Pending, e: Ending) -> RequestRow:
    f = e.finished
    if f.reason is FinishReason.EXPIRED:
        return request_row(p, status=RequestStatus.EXPIRED, error="no first token by the deadline")
    if f.reason is FinishReason.CANCELLED:
        return request_row(p, status=RequestStatus.CANCELLED, error="cancelled")
    return request_row(
        p,
        status=RequestStatus.SUCCEEDED,
        output=answer(e),
        compute_start=f.first_token_at,
        compute_end=f.finished_at,
    )


@dataclass
class Held:
    """A request between intake and its final row."""

    pending: Pending
    prepared: Prepared | None = None
    failed: str | None = None  # refused or its step failed: a failed row
    status: RequestStatus = RequestStatus.FAILED  # or EXPIRED: never ran by its deadline


class Flusher:
    def __init__(self, db: Engine, model: str, done: Done, stopping: threading.Event):
        """``model``: the generation model's name (its metrics' label); ``done``: the
        offsets of what was written, and how many rows."""
        self.db, self.model, self.done, self.stopping = db, model, done, stopping
        self.outbox = Outbox()
        self.lock = threading.Condition()  # guards outbox, held and failures
        self.held: dict[str, Held] = {}
        self.failures: list[Held] = []
        self.thread: threading.Thread | None = None

    def start(self, supervisor: Supervisor) -> None:
        self.thread = supervisor.start(self._flush_loop, name="gen-flush")

    def join(self, timeout_s: float) -> None:
        if self.thread is not None:
            self.thread.join(timeout_s)

    # ---- what the lane's and the step loop's threads hand over -------------------------
    def refuse(self, h: Held) -> None:
        """A request that will not run (``h.failed`` says why): a failed row."""
        with self.lock:
            self.failures.append(h)
            self.lock.notify_all()

    def open(self, h: Held, tenant_id: str, prior_texts: Iterable[str]) -> None:
        """A request joins the running batch; its stream starts after ``prior_texts``."""
        rid = h.pending.msg.request_id
        with self.lock:
            self.held[rid] = h
            self.outbox.open(rid, tenant_id, tuple(prior_texts))

    def reject(self, rid: str, why: str) -> None:
        """A request the policy would not take after all: a failed row instead."""
        with self.lock:
            h = self.held.pop(rid, None)
            self.outbox.drop(rid)
            if h is not None:
                self.failures.append(Held(h.pending, failed=why))
            self.lock.notify_all()

    def drop(self, tps: set[TopicPartition]) -> list[str]:
        """Partitions moved: forget their requests without a word (the new owner resumes
        them); returns their ids."""
        with self.lock:
            gone = [rid for rid, h in self.held.items() if h.pending.tp in tps]
            for rid in gone:
                del self.held[rid]
                self.outbox.drop(rid)
        return gone

    def gather(self, events: list[Event]) -> None:
        """A step's events (the step loop's sink)."""
        with self.lock:
            self.outbox.add(events)
            for e in events:
                if isinstance(e, Failed):
                    h = self.held.pop(e.seq_id, None)
                    self.outbox.drop(e.seq_id)
                    if h is not None:
                        h.failed = f"the model failed: {e.error}"
                        self.failures.append(h)
            self.lock.notify_all()

    # ---- the flusher's thread -------------------------------------------------------------------
    def _flush_loop(self) -> None:
        while True:
            with self.lock:
                self.lock.wait(FLUSH_WAIT_S)
                flush = self.outbox.take()
                failures, self.failures = self.failures, []
                ended = [(e, self.held.pop(e.request_id, None)) for e in flush.endings]
            if flush or failures:
                self._write(flush, ended, failures)
            elif self.stopping.is_set():
                return

    def _write(
        self, flush: Flush, ended: list[tuple[Ending, Held | None]], failures: list[Held]
    ) -> None:
        progress = [
            {
                "request_id": r.request_id,
                "first_index": r.first_index,
                "tenant_id": r.tenant_id,
                "token_ids": list(r.token_ids),
                "texts": list(r.texts),
            }
            for r in flush.progress
        ]
        rows: list[RequestRow] = []
        offsets: list[tuple[TopicPartition, int]] = []
        for e, h in ended:
            if h is None:  # its partition moved meanwhile: the new owner writes it
                continue
            rows.append(final_row(h.pending, e))
            offsets.append((h.pending.tp, h.pending.offset))
        for h in failures:
            rows.append(request_row(h.pending, status=h.status, error=h.failed or "failed"))
            offsets.append((h.pending.tp, h.pending.offset))
        while True:
            try:
                with self.db.begin() as conn:
                    write_flush(conn, progress, rows)
                settle_jobs(self.db, rows)
                break
            except Exception as exc:
                # PostgreSQL away: keep trying; nothing is committed meanwhile, and the
                # callers' streams wait (what the database does not hold is not shown).
                log.warning("generation flush failed (retrying): %s", first_line(exc))
                if self.stopping.wait(0.5):
                    return
        metrics.persisted(rows)
        for e, _ in ended:
            f = e.finished
            if f.first_token_at is not None:
                metrics.generation_ttft(self.model, f.first_token_at - f.arrived_at)
        if offsets:
            self.done(offsets, len(rows))
