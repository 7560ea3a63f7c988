"""The generation engine: Kafka's requests through continuous batching, steps on a
worker process, tokens and answers into PostgreSQL (decision 32).

One of the scheduler's two engines (scheduler/runtime/engines.py). Its step loop is
the core's ``Engine.serve`` (scheduler/core/generation/engine.py), the loop its unit
tests run, in one supervised thread that owns the policy. This module only feeds it:
requests from the lanes join between steps (``Call``: a request still running here is
not run twice), revocations drop theirs, each generation worker that says hello becomes
its runner (``Attach``); a worker that is lost costs a recompute, and the loop waits for
the replacement the worker pool starts. Each step's events go to the flusher
(flusher.py), which writes them and only then marks their offsets done.

A request this scheduler takes over (its owner died, its partition moved) is resumed
from its progress rows: the tokens already streamed are recomputed with the prompt,
never sent again, and generation goes on after them. One whose final row exists
already is not generated again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from sqlalchemy import Engine as Database

from core.generation import StepOutput, StepPlan
from core.load_report import KVState, LoadReport
from core.models.causal_lm import CausalLMSpec
from core.models.lm_codec import Codec, shared_codec
from core.models.readiness import Readiness
from core.protocol import GenerationInfo, GenStep
from core.vocab import ModelRef
from results.faults import first_line
from results.generation import finished, read_streamed
from scheduler.core.batcher import Pending
from scheduler.core.generation.config import PolicyConfig
from scheduler.core.generation.engine import (
    Attach,
    Call,
    Command,
    Engine,
    RunnerLost,
    StepFailed,
    StepStats,
)
from scheduler.core.generation.kv_report import DecodeRate, kv_state
from scheduler.core.generation.policy import ContinuousBatcher
from scheduler.core.generation.requests import Progress, Refused, prepare
from scheduler.core.offsets import TopicPartition
from scheduler.runtime import metrics
from scheduler.runtime.engines import Announcement
from scheduler.runtime.generation.flusher import Done, Flusher, Held
from scheduler.runtime.host import CoreHost
from scheduler.runtime.supervisor import Supervisor
from scheduler.runtime.workerpool import WorkerHandle, WorkerLost, WorkerPool

log = logging.getLogger(__name__)

# A worker that returns no step within this long hangs (s): the longest step is one
# full token budget of prefill, under a second on this CPU.
STEP_TIMEOUT_S = 30.0


class WorkerRunner:
    """The policy's runner: one worker process, over its socket."""

    def __init__(self, handle: WorkerHandle, spec: CausalLMSpec):
        self.handle = handle
        self.spec = spec
        self._n = 0

    def execute(self, plan: StepPlan) -> StepOutput:
        self._n += 1
        step_id = f"{self.handle.worker_id}-{self._n}"
        try:
            self.handle.send(GenStep(step_id, self.spec.name, self.spec.version, plan))
            result = self.handle.receive_step(STEP_TIMEOUT_S)
        except WorkerLost as exc:
            raise RunnerLost(str(exc)) from exc
        if result.output is None:
            raise StepFailed(result.error or "the step failed")
        return result.output


def policy_config(info: GenerationInfo) -> PolicyConfig:
    return PolicyConfig(
        num_blocks=info.num_blocks,
        block_size=info.block_size,
        max_step_tokens=info.max_step_tokens,
        max_running=info.max_running,
        max_model_len=info.max_model_len,
    )


class GenerationEngine:
    def __init__(
        self,
        db: Database,
        spec: CausalLMSpec,
        host: CoreHost,
        *,
        model: str,
        socket_dir: Path,
        done: Done,
        stopping: threading.Event,
        supervisor: Supervisor,
        on_worker: Callable[[], None] = lambda: None,
    ):
        self.db = db
        self.spec = spec
        self.host = host
        self.stopping = stopping
        self.supervisor = supervisor
        self.on_worker = on_worker  # a worker said hello: the service announces it
        self.codec: Codec = shared_codec()
        self.inbox: queue.Queue[Command] = queue.Queue()
        self.flusher = Flusher(db, spec.name, done, stopping)
        self.pool = WorkerPool(
            socket_path=socket_dir / "lm.sock",
            n_local=1,
            models=[model],  # as the command line named it
            on_ready=self._on_worker,
            supervisor=supervisor,
        )
        self.info: GenerationInfo | None = None
        self.handles: list[WorkerHandle] = []
        self.loop: Engine | None = None  # the step loop, from the first worker's pool size
        self._thread: threading.Thread | None = None
        self._preempted = 0
        self.decode_rate = DecodeRate()
        # The KV cache after the latest step, for the load report: replaced whole by the
        # step loop (which owns the policy), read by the heartbeat thread.
        self.kv: KVState | None = None

    # ---- the engine's interface --------------------------------------------------------
    def runs(self, model: str) -> bool:
        return model == self.spec.name

    def take(self, items: list[Pending], owned: set[TopicPartition]) -> None:
        """Requests of owned partitions, their offsets held by the core until their
        final rows are written."""
        self.submit(self.host.hold(items, owned))

    def revoke(self, tps: list[TopicPartition]) -> None:
        self.inbox.put(Call(partial(self._drop, set(tps))))

    def start(self) -> None:
        self.flusher.start(self.supervisor)
        self.pool.start()

    def refresh(self) -> list[Readiness]:
        """Its worker's version: ready while its process is connected, loading until it
        says hello (the API answers 503 with Retry-After then)."""
        ready = sum(1 for h in self.handles if h.alive)
        return [
            Readiness(self.spec.name, self.spec.version, ready=ready, loading=0 if ready else 1)
        ]

    def announced(self) -> list[Announcement]:
        if self.info is None:
            return []
        ref = ModelRef(self.spec.name, self.spec.version)
        return [Announcement(ref, self.info.max_running, {})]

    def report(self, report: LoadReport) -> None:
        kv = self.kv
        if kv is not None:
            report.kv = {self.spec.ref: kv}

    def stop_restarts(self) -> None:
        self.pool.stop_restarts()

    def finish(self, deadline: float) -> None:
        """What is generating is left to the partitions' next owner, which resumes it
        from the progress rows flushed here; finished rows are written first."""
        for t in (self._thread, self.flusher.thread):
            if t is not None:
                t.join(max(0.1, deadline - time.time()))
        for h in self.handles:
            h.stop()
        self.pool.stop()

    # ---- intake (a consumer lane's thread) ---------------------------------------------
    def submit(self, items: Sequence[Pending]) -> None:
        """Queue requests whose offsets the dispatch core holds; each ends in one row."""
        if not items:
            return
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
            self.flusher.done(skip, 0)
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
                self.flusher.refuse(Held(p, failed=got.reason))
            else:
                self.inbox.put(Call(partial(self._join, Held(p, got))))

    # ---- workers (the pool's accept thread) ---------------------------------------------
    def _on_worker(self, h: WorkerHandle) -> None:
        info = h.hello.models[0].generation
        assert info is not None, "a generation worker announces its pool"
        self.handles.append(h)
        metrics.GEN_KV_TOTAL.labels(self.spec.name).set(info.num_blocks)
        if self.loop is None:
            self.info = info
            policy = ContinuousBatcher(policy_config(info), self.codec.decode, self.codec.eos_id)
            self.loop = Engine(policy, WorkerRunner(h, self.spec), clock=time.time)
            self._thread = self.supervisor.start(
                self.loop.serve,
                self.inbox,
                self.flusher.gather,
                self.stopping,
                self._stepped,
                name="gen-steps",
            )
        else:
            self.inbox.put(Attach(WorkerRunner(h, self.spec)))
        self.on_worker()

    # ---- on the step loop's thread, between steps ----------------------------------------
    def _join(self, h: Held, loop: Engine) -> None:
        assert h.prepared is not None
        rid = h.pending.msg.request_id
        if rid in loop.policy:  # redelivered while still running here
            self.flusher.done([(h.pending.tp, h.pending.offset)], 0)
            return
        self.flusher.open(h, h.pending.msg.tenant_id, h.prepared.prior_texts)
        if not loop.submit(h.prepared.req):
            rid_, why = loop.rejected.pop()
            self.flusher.reject(rid_, why)

    def _drop(self, tps: set[TopicPartition], loop: Engine) -> None:
        """Partitions moved: their requests are the new owner's, who resumes them."""
        now = time.time()
        for rid in self.flusher.drop(tps):
            loop.policy.cancel(rid, now)

    def _stepped(self, st: StepStats) -> None:
        assert self.loop is not None
        policy = self.loop.policy
        rate = self.decode_rate.add(time.time(), st.step_s, st.sampled)
        self.kv = kv_state(policy, rate)
        preempted = policy.preemptions - self._preempted
        self._preempted = policy.preemptions
        metrics.generation_step(
            self.spec.name, st.step_s, st.sampled, st.tokens, st.kv_used, preempted
        )
