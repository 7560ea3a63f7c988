"""Generation in the scheduler: Kafka's requests through the continuous-batching
policy, steps on a worker process, tokens and answers into PostgreSQL.

The policy (policy.py) and what its events become (outbox.py) are pure; this module
runs them (decision 32). Two threads:

* the step loop owns the policy: between steps it takes in new requests (joining
  the running batch at the next step) and revocations, then sends one step to the
  worker and waits for its tokens. A worker that is lost costs a recompute: its KV
  pool is gone, so every running sequence is preempted (``drop_cache``) and the
  loop waits for the replacement the worker pool starts;
* the flusher writes what the outbox gathered, in one transaction per flush: new
  tokens as progress rows, ended requests as their request-log rows (the same
  writer as batches use, so waiters and jobs hear of them alike). Only then are
  their Kafka offsets done: an accepted request is never committed before its row.

A request this scheduler takes over (its owner died, its partition moved) is
resumed from its progress rows: the tokens already streamed are recomputed with the
prompt, never sent again, and generation goes on after them. One whose final row
exists already is not generated again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from core.generation import StepOutput, StepPlan
from core.load_report import KVState
from core.models.causal_lm import CausalLMSpec
from core.models.lm_codec import Codec, shared_codec
from core.protocol import GenerationInfo, GenStep
from core.request_row import RequestRow
from core.vocab import RequestStatus
from results import modelregistry
from results.faults import first_line
from results.generation import finished, read_streamed, write_flush
from scheduler.core.batcher import Pending
from scheduler.core.generation.config import PolicyConfig
from scheduler.core.generation.engine import Engine as StepEngine
from scheduler.core.generation.events import gap_summary
from scheduler.core.generation.kv_report import DecodeRate, kv_state
from scheduler.core.generation.outbox import Ending, Flush, Outbox
from scheduler.core.generation.policy import ContinuousBatcher
from scheduler.core.generation.requests import Prepared, Progress, Refused, prepare
from scheduler.core.generation.sequence import FinishReason
from scheduler.runtime import metrics
from scheduler.runtime.rows import request_row
from scheduler.runtime.workerpool import WorkerHandle, WorkerLost

log = logging.getLogger("gristmill.scheduler.generation")

TopicPartition = tuple[str, int]
Done = Callable[[list[tuple[TopicPartition, int]], int], None]

# How long the flusher gathers before a write when the outbox is quiet (s): a step
# on this CPU takes 10-30 ms (docs/bench/generation.md), so a caller's token waits at
# most about one more step for its row.
FLUSH_WAIT_S = 0.01
# A worker that returns no step within this long hangs (s): the longest step is one
# full token budget of prefill, under a second on this CPU.
STEP_TIMEOUT_S = 30.0


class StepFailed(Exception):
    """The worker ran the step and the model raised: its sequences fail."""


class WorkerRunner:
    """The policy's runner: one worker process, over its socket."""

    def __init__(self, handle: WorkerHandle, spec: CausalLMSpec):
        self.handle = handle
        self.spec = spec
        self._n = 0

    def execute(self, plan: StepPlan) -> StepOutput:
        self._n += 1
        step_id = f"{self.handle.worker_id}-{self._n}"
        self.handle.send(GenStep(step_id, self.spec.name, self.spec.version, plan))
        result = self.handle.receive_step(STEP_TIMEOUT_S)
        if result.output is None:
            raise StepFailed(result.error or "the step failed")
        return result.output


def info_blocks(h: WorkerHandle) -> int:
    info = h.hello.models[0].generation
    return 0 if info is None else info.num_blocks


def policy_config(info: GenerationInfo) -> PolicyConfig:
    return PolicyConfig(
        num_blocks=info.num_blocks,
        block_size=info.block_size,
        max_step_tokens=info.max_step_tokens,
        max_running=info.max_running,
        max_model_len=info.max_model_len,
    )


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
class _Held:
    """A request between intake and its final row."""

    pending: Pending
    prepared: Prepared | None = None
    failed: str | None = None  # refused or its step failed: a failed row


class GenerationService:
    def __init__(self, engine: Engine, spec: CausalLMSpec, done: Done, stopping: threading.Event):
        self.db = engine
        self.spec = spec
        self.done = done
        self.stopping = stopping
        self.codec: Codec = shared_codec()
        self.inbox: queue.Queue[_Held | list[TopicPartition] | WorkerHandle] = queue.Queue()
        self.outbox = Outbox()
        self.lock = threading.Condition()  # guards outbox, held and failures
        self.held: dict[str, _Held] = {}
        self.failures: list[_Held] = []
        self.info: GenerationInfo | None = None
        self.handles: list[WorkerHandle] = []
        self.steps = 0
        self._preempted = 0
        self.decode_rate = DecodeRate()
        # The KV cache after the latest step, for the load report: replaced whole by the
        # step loop (which owns the policy), read by the heartbeat thread.
        self.kv: KVState | None = None
        self._threads = [
            threading.Thread(target=self._step_loop, name="gen-steps", daemon=True),
            threading.Thread(target=self._flush_loop, name="gen-flush", daemon=True),
        ]

    # ---- life cycle ------------------------------------------------------------------
    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self, timeout_s: float = 10.0) -> None:
        for t in self._threads:
            t.join(timeout_s)

    def stop_workers(self) -> None:
        for h in self.handles:
            h.stop()

    def on_worker(self, h: WorkerHandle) -> None:
        self.handles.append(h)
        if self.info is None:
            self.info = h.hello.models[0].generation
        self.inbox.put(h)
        self.announce()

    def announce(self) -> None:
        if self.info is None:
            return
        try:
            with self.db.begin() as conn:
                modelregistry.announce(
                    conn, self.spec.name, self.spec.version, self.info.max_running, {}
                )
        except Exception as exc:  # the scheduler's heartbeat announces again
            log.warning("model announce failed: %s", first_line(exc))

    # ---- intake (a consumer lane's thread) --------------------------------------------
    def submit(self, items: Sequence[Pending]) -> None:
        """Queue requests whose offsets the dispatch core tracks; each ends in one row."""
        ids = [p.msg.request_id for p in items]
        try:
            with self.db.connect() as conn:
                done_before = finished(conn, ids)
                streamed = read_streamed(conn, ids)
        except Exception as exc:
            # Without their progress they cannot resume: leave them uncommitted; the
            # partition's next reader (this one after a restart) takes them again.
            log.warning("reading generation progress failed: %s", first_line(exc))
            return
        skip = [(p.tp, p.offset) for p in items if p.msg.request_id in done_before]
        if skip:
            self.done(skip, 0)
        for p in items:
            rid = p.msg.request_id
            if rid in done_before:
                continue
            s = streamed.get(rid)
            got = prepare(
                p.msg,
                rank=p.rank,
                encode=self.codec.encode,
                context_length=self.spec.context_length,
                progress=Progress(s.token_ids, s.texts) if s else None,
            )
            if isinstance(got, Refused):
                with self.lock:
                    self.failures.append(_Held(p, failed=got.reason))
                    self.lock.notify_all()
            else:
                self.inbox.put(_Held(p, got))

    def revoke(self, tps: list[TopicPartition]) -> None:
        self.inbox.put(list(tps))

    # ---- the step loop -----------------------------------------------------------------
    def _step_loop(self) -> None:
        engine: StepEngine | None = None
        runner: WorkerRunner | None = None
        waiting: list[_Held] = []  # arrived before the first worker said how big its pool is
        while not self.stopping.is_set():
            busy = engine is not None and runner is not None and engine.policy.has_work()
            try:
                cmd = self.inbox.get(timeout=0 if busy else 0.05)
            except queue.Empty:
                cmd = None
            while cmd is not None:
                if isinstance(cmd, WorkerHandle):
                    if engine is None:
                        info = cmd.hello.models[0].generation
                        assert info is not None, "a generation worker announces its pool"
                        policy = ContinuousBatcher(
                            policy_config(info), self.codec.decode, self.codec.eos_id
                        )
                        engine = StepEngine(policy, WorkerRunner(cmd, self.spec), clock=time.time)
                    runner = WorkerRunner(cmd, self.spec)
                    engine.runner = runner
                    metrics.GEN_KV_TOTAL.labels(self.spec.name).set(info_blocks(cmd))
                elif isinstance(cmd, list):
                    self._drop(engine, set(cmd), waiting)
                else:
                    waiting.append(cmd)
                try:
                    cmd = self.inbox.get_nowait()
                except queue.Empty:
                    cmd = None
            if engine is None:
                continue
            for h in waiting:
                self._join(engine, h)
            waiting = []
            if runner is None or not engine.policy.has_work():
                continue
            try:
                events = engine.step()
            except WorkerLost as exc:
                log.warning("generation worker lost (%s); running sequences will recompute", exc)
                engine.policy.drop_cache(time.time())
                runner = None
                continue
            except StepFailed as exc:
                self._fail_running(engine, str(exc))
                continue
            self.steps += 1
            st = engine.last
            if st is not None:
                rate = self.decode_rate.add(time.time(), st.step_s, st.sampled)
                self.kv = kv_state(engine.policy, rate)
                preempted = engine.policy.preemptions - self._preempted
                self._preempted = engine.policy.preemptions
                metrics.generation_step(
                    self.spec.name, st.step_s, st.sampled, st.tokens, st.kv_used, preempted
                )
            if events:
                with self.lock:
                    self.outbox.add(events)
                    self.lock.notify_all()

    def _join(self, engine: StepEngine, h: _Held) -> None:
        assert h.prepared is not None
        rid = h.pending.msg.request_id
        if rid in engine.policy:  # redelivered while still running here
            self.done([(h.pending.tp, h.pending.offset)], 0)
            return
        with self.lock:
            self.held[rid] = h
            self.outbox.open(rid, h.pending.msg.tenant_id, h.prepared.prior_texts)
        if not engine.submit(h.prepared.req):
            rid_, why = engine.rejected.pop()
            with self.lock:
                self.held.pop(rid_, None)
                self.outbox.drop(rid_)
                self.failures.append(_Held(h.pending, failed=why))
                self.lock.notify_all()

    def _drop(
        self, engine: StepEngine | None, tps: set[TopicPartition], waiting: list[_Held]
    ) -> None:
        """Partitions moved: their requests are the new owner's, who resumes them."""
        waiting[:] = [h for h in waiting if h.pending.tp not in tps]
        with self.lock:
            gone = [rid for rid, h in self.held.items() if h.pending.tp in tps]
            for rid in gone:
                del self.held[rid]
                self.outbox.drop(rid)
        if engine is not None:
            for rid in gone:
                engine.policy.cancel(rid, time.time())

    def _fail_running(self, engine: StepEngine, error: str) -> None:
        """The model raised on a step: its sequences fail (a retry would raise again)."""
        log.warning("generation step failed: %s", error)
        now = time.time()
        for s in list(engine.policy.running):
            engine.policy.cancel(s.seq_id, now)
            with self.lock:
                h = self.held.pop(s.seq_id, None)
                self.outbox.drop(s.seq_id)
                if h is not None:
                    h.failed = f"the model failed: {error}"
                    self.failures.append(h)
        with self.lock:
            self.lock.notify_all()

    # ---- the flusher -------------------------------------------------------------------
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
        self, flush: Flush, ended: list[tuple[Ending, _Held | None]], failures: list[_Held]
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
            rows.append(
                request_row(h.pending, status=RequestStatus.FAILED, error=h.failed or "failed")
            )
            offsets.append((h.pending.tp, h.pending.offset))
        while True:
            try:
                with self.db.begin() as conn:
                    write_flush(conn, progress, rows)
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
                metrics.generation_ttft(self.spec.name, f.first_token_at - f.arrived_at)
        if offsets:
            self.done(offsets, len(rows))
