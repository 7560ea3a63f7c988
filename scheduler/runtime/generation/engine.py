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
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path

from sqlalchemy import Engine as Database

from core.generation import Chunk, StepOutput, StepPlan
from core.load_report import KVState, LoadReport
from core.models.causal_lm import CausalLMSpec
from core.models.lm_codec import Codec, shared_codec
from core.models.readiness import Readiness
from core.models.registry import VersionRecord
from core.protocol import GenerationInfo, GenStep, ModelStatus
from core.vocab import ModelRef, RequestStatus
from results.faults import first_line
from results.generation import finished, read_streamed
from scheduler.core.batcher import Pending
from scheduler.core.generation.config import PolicyConfig
from scheduler.core.generation.engine import (
    Attach,
    Call,
    Command,
    Engine,
    PartFailed,
    RunnerLost,
    StepFailed,
    StepStats,
)
from scheduler.core.generation.kv_report import DecodeRate, kv_state
from scheduler.core.generation.policy import ContinuousBatcher
from scheduler.core.generation.requests import Progress, Refused, prepare
from scheduler.core.generation.versions import Fate, Versions
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
    """The policy's runner: one worker process, over its socket. A step whose sequences
    belong to several versions (a canary beside the live one, decision 67) goes to the
    worker as one ``GenStep`` per version, sent together and answered in order; each
    version computes its sequences on its own KV pool, under the policy's block ids."""

    def __init__(self, handle: WorkerHandle, name: str, version_of: Mapping[str, str]):
        self.handle = handle
        self.name = name
        self.version_of = version_of  # seq id -> version (the step loop's, read there)
        self._n = 0

    def execute(self, plan: StepPlan) -> StepOutput:
        self._n += 1
        step_id = f"{self.handle.worker_id}-{self._n}"
        groups: dict[str, list[Chunk]] = {}
        for c in plan.chunks:
            groups.setdefault(self.version_of[c.seq_id], []).append(c)
        sampled: dict[str, int] = {}
        compute_s = 0.0
        errors: list[str] = []
        failed: set[str] = set()
        try:
            for v, chunks in groups.items():
                part = StepPlan(plan.step, tuple(chunks), plan.block_size)
                self.handle.send(GenStep(f"{step_id}-{v}", self.name, v, part))
            for v, chunks in groups.items():  # answered in the order sent
                result = self.handle.receive_step(STEP_TIMEOUT_S)
                if result.output is None:
                    errors.append(f"{self.name}@{v}: {result.error or 'the step failed'}")
                    failed.update(c.seq_id for c in chunks)
                    continue
                sampled.update(result.output.sampled)
                compute_s += result.output.compute_s
        except WorkerLost as exc:
            raise RunnerLost(str(exc)) from exc
        out = StepOutput(plan.step, sampled, compute_s)
        if len(errors) == len(groups):
            raise StepFailed("; ".join(errors))
        if errors:  # one version's failure is not the other versions' requests'
            raise PartFailed("; ".join(errors), frozenset(failed), out)
        return out


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
        records: Callable[[], Iterable[VersionRecord]] = lambda: (),
        on_worker: Callable[[], None] = lambda: None,
    ):
        self.db = db
        self.spec = spec
        self.host = host
        self.stopping = stopping
        self.supervisor = supervisor
        self.on_worker = on_worker  # a worker said hello: the service announces it
        self.records = records  # the registry as the scheduler read it last
        # The versions on the worker (decision 67): guarded by ``_vlock`` (the model loop,
        # the worker's status reader, the accept thread and the step loop all look).
        self.versions = Versions(spec.name)
        self._vlock = threading.Lock()
        # The step loop's own: each running request's version, requests waiting for
        # their version to load, and (read by the model loop) the versions in use.
        self.version_of: dict[str, str] = {}
        self.parked: dict[str, list[Held]] = {}
        self._busy: frozenset[str] = frozenset()
        self._attach: WorkerRunner | None = None  # a replacement worker, until it holds them
        self.codec: Codec = shared_codec()
        self.inbox: queue.Queue[Command] = queue.Queue()
        self.flusher = Flusher(db, spec.name, done, stopping)
        self.pool = WorkerPool(
            socket_path=socket_dir / "lm.sock",
            n_local=1,
            models=[model],  # as the command line named it
            on_ready=self._on_worker,
            on_status=self._on_status,
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
        """Move the worker toward the registry's open versions (decision 67); each
        version's readiness: ready while its worker holds it, loading until then (the
        API answers 503 with Retry-After)."""
        handle = self._handle()
        with self._vlock:
            self.versions.set_registry(self.records())
            commands = self.versions.tick(time.time(), self._busy) if handle else []
            ready = {v for v in self._busy | set(self.parked) if self.versions.ready(v)}
            attach = self._attach is not None and ready >= self._busy
            readiness = self.versions.readiness(handle is not None)
        for cmd in commands:
            assert handle is not None
            handle.command(cmd)
        if attach:  # a replacement worker holds every version in use: step on it
            runner, self._attach = self._attach, None
            assert runner is not None
            self.inbox.put(Attach(runner))
        if self.parked:
            self.inbox.put(Call(self._unpark))
        return readiness

    def announced(self) -> list[Announcement]:
        with self._vlock:
            infos = self.versions.ready_infos()
        return [
            Announcement(ModelRef(i.name, i.version), i.generation.max_running, {})
            for i in infos
            if i.generation is not None
        ]

    def report(self, report: LoadReport) -> None:
        """The one KV pool the policy plans, under every version it serves."""
        kv = self.kv
        if kv is not None:
            with self._vlock:
                refs = [f"{i.name}@{i.version}" for i in self.versions.ready_infos()]
            report.kv = {ref: kv for ref in refs or [self.spec.ref]}

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

    # ---- workers (the pool's accept thread, the worker's reader) -------------------------
    def _handle(self) -> WorkerHandle | None:
        return next((h for h in reversed(self.handles) if h.alive), None)

    def _on_status(self, h: WorkerHandle, s: ModelStatus) -> None:
        with self._vlock:
            self.versions.on_status(s, time.time())
        self.on_worker()  # announce what is ready now

    def _on_worker(self, h: WorkerHandle) -> None:
        info = next((m.generation for m in h.hello.models if m.generation is not None), None)
        assert info is not None, "a generation worker announces its pool"
        self.handles.append(h)
        metrics.GEN_KV_TOTAL.labels(self.spec.name).set(info.num_blocks)
        with self._vlock:
            if self.versions.pool is None:
                self.versions.pool = info
            self.versions.on_hello(h.hello.models)
            holds_all = all(self.versions.ready(v) for v in self._busy)
        runner = WorkerRunner(h, self.spec.name, self.version_of)
        if self.loop is None:
            self.info = info
            policy = ContinuousBatcher(policy_config(info), self.codec.decode, self.codec.eos_id)
            self.loop = Engine(policy, runner, clock=time.time)
            self._thread = self.supervisor.start(
                self.loop.serve,
                self.inbox,
                self.flusher.gather,
                self.stopping,
                self._stepped,
                name="gen-steps",
            )
        elif holds_all:
            self.inbox.put(Attach(runner))
        else:
            # It holds its boot versions only: it takes steps once it holds every
            # version in use (``refresh`` loads them, then attaches it).
            self._attach = runner
        self.on_worker()

    # ---- on the step loop's thread, between steps ----------------------------------------
    def _join(self, h: Held, loop: Engine) -> None:
        assert h.prepared is not None
        rid = h.pending.msg.request_id
        if rid in loop.policy:  # redelivered while still running here
            self.flusher.done([(h.pending.tp, h.pending.offset)], 0)
            return
        version = h.pending.msg.version or self.spec.version
        with self._vlock:
            known, ready = self.versions.known(version), self.versions.ready(version)
        if not known:
            self.flusher.refuse(
                Held(h.pending, failed=f"{self.spec.name}@{version} is not in the registry")
            )
            return
        if not ready:  # loading (or its worker is being replaced): it waits here
            self.parked.setdefault(version, []).append(h)
            self._busy = self._busy | {version}
            return
        self.version_of[rid] = version
        self._busy = self._busy | {version}
        self.flusher.open(h, h.pending.msg.tenant_id, h.prepared.prior_texts)
        if not loop.submit(h.prepared.req):
            rid_, why = loop.rejected.pop()
            self.flusher.reject(rid_, why)

    def _unpark(self, loop: Engine) -> None:
        """Requests whose version is loaded now join; those whose version failed to load
        end failed with its reason, and those whose first-token deadline passed while
        they waited end expired, as the policy would have ended them."""
        parked, self.parked = self.parked, {}
        now = time.time()
        for version, held in parked.items():
            ref = f"{self.spec.name}@{version}"
            for h in held:
                with self._vlock:
                    fate = self.versions.waiting_fate(version, h.pending.msg.deadline, now)
                    slot = self.versions.held.get(version)
                if fate is Fate.FAIL:
                    why = f"{ref} cannot be served here: {slot.error if slot else 'failed'}"
                    self.flusher.refuse(Held(h.pending, failed=why))
                elif fate is Fate.EXPIRE:
                    why = f"no first token by the deadline ({ref} was loading)"
                    self.flusher.refuse(Held(h.pending, failed=why, status=RequestStatus.EXPIRED))
                else:  # joins, or waits again
                    self._join(h, loop)

    def _drop(self, tps: set[TopicPartition], loop: Engine) -> None:
        """Partitions moved: their requests are the new owner's, who resumes them."""
        now = time.time()
        for rid in self.flusher.drop(tps):
            loop.policy.cancel(rid, now)
        for version, held in self.parked.items():
            self.parked[version] = [h for h in held if h.pending.tp not in tps]

    def _stepped(self, st: StepStats) -> None:
        assert self.loop is not None
        policy = self.loop.policy
        rate = self.decode_rate.add(time.time(), st.step_s, st.sampled)
        self.kv = kv_state(policy, rate)
        # Versions in use: those of running or waiting requests (the model loop keeps
        # them loaded); a request that ended is forgotten.
        for rid in [r for r in self.version_of if r not in policy]:
            del self.version_of[rid]
        self._busy = frozenset(self.version_of.values()) | {
            v for v, held in self.parked.items() if held
        }
        preempted = policy.preemptions - self._preempted
        self._preempted = policy.preemptions
        metrics.generation_step(
            self.spec.name, st.step_s, st.sampled, st.tokens, st.kv_used, preempted
        )
