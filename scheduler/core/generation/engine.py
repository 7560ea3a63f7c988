"""The step loop: run the policy against a model, one step at a time.

``Engine.step`` is schedule -> execute -> update. ``Engine.serve`` is the loop that
runs in production (scheduler/runtime/generation/engine.py) and in the tests alike, in
one thread that owns the policy (no locks around it): between steps it drains an inbox
of commands (new requests, cancellations, a new runner, the runtime's own work that
must run between steps), so sequences join the running batch at the next step; it
hands each step's events to a sink; when there is nothing to compute, or no runner to
compute it, it blocks on the inbox. A runner that is lost costs a recompute: its KV
pool is gone, so every running sequence is preempted and waits for the next runner; a
step the model fails ends its sequences with ``Failed`` events.

The runner is anything with ``execute(plan) -> StepOutput``: the model in this process
(workers/models/causal_lm/runner.py) or a proxy to a worker process. The loop blocks on
its inbox but touches nothing else outside: runner, sink, clock and stop are given.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from core.generation import StepOutput, StepPlan
from scheduler.core.generation.events import Event, Failed
from scheduler.core.generation.policy import ContinuousBatcher, InvalidRequest
from scheduler.core.generation.sequence import GenRequest

log = logging.getLogger(__name__)

Clock = Callable[[], float]
Sink = Callable[[list[Event]], None]


class StepRunner(Protocol):
    def execute(self, plan: StepPlan) -> StepOutput: ...


class RunnerLost(Exception):
    """The runner is gone with its KV pool (its worker process died or hung)."""


class StepFailed(Exception):
    """The runner ran the step and the model raised: its sequences fail."""


class PartFailed(Exception):
    """The runner ran the step in parts (one per model version, decision 67) and some
    raised: the sequences of those parts fail, the others go on with ``output``."""

    def __init__(self, error: str, seq_ids: frozenset[str], output: StepOutput):
        super().__init__(error)
        self.seq_ids = seq_ids
        self.output = output


@dataclass(frozen=True, slots=True)
class Cancel:
    seq_id: str


@dataclass(frozen=True, slots=True)
class Attach:
    """A runner to step on from now: the first, or the one that replaces a lost one."""

    runner: StepRunner


@dataclass(frozen=True, slots=True)
class Call:
    """Work of the loop's owner that must run between steps, on the loop's thread (a
    request that joins only if it is not running already, a revocation)."""

    fn: Callable[[Engine], None]


Command = GenRequest | Cancel | Attach | Call


@dataclass(frozen=True, slots=True)
class StepStats:
    step: int
    tokens: int  # tokens computed (decodes + prefill chunks)
    sequences: int  # chunks in the step
    sampled: int
    compute_s: float  # the runner's time
    step_s: float  # schedule + execute + update
    kv_used: int  # blocks held after the step
    running: int
    waiting: int


class Engine:
    def __init__(
        self, policy: ContinuousBatcher, runner: StepRunner | None, clock: Clock = time.monotonic
    ):
        self.policy = policy
        self.runner = runner
        self.clock = clock
        self.last: StepStats | None = None
        self.rejected: list[tuple[str, str]] = []  # (seq_id, why): invalid requests

    def submit(self, req: GenRequest) -> bool:
        try:
            self.policy.add(req)
        except InvalidRequest as exc:
            self.rejected.append((req.seq_id, str(exc)))
            return False
        return True

    def ready(self) -> bool:
        """Whether a step would compute something: work, and a runner to do it."""
        return self.runner is not None and self.policy.has_work()

    def step(self) -> list[Event]:
        """One step (``RunnerLost``, ``StepFailed`` from the runner pass through)."""
        assert self.runner is not None, "no runner to step on"
        t0 = self.clock()
        plan = self.policy.schedule(t0)
        failed: list[Event] = []
        try:
            out = self.runner.execute(plan) if plan.chunks else StepOutput(plan.step)
        except PartFailed as exc:  # a version's part: its sequences end, the rest go on
            log.warning("generation step partly failed: %s", exc)
            out = exc.output
            failed = self._fail(exc.seq_ids, str(exc))
        events = failed + self.policy.update(plan, out, self.clock())
        p = self.policy
        self.last = StepStats(
            step=plan.step,
            tokens=plan.num_tokens,
            sequences=len(plan.chunks),
            sampled=len(out.sampled),
            compute_s=out.compute_s,
            step_s=self.clock() - t0,
            kv_used=p.pool.used,
            running=len(p.running),
            waiting=p.num_waiting,
        )
        return events

    def fail_running(self, error: str) -> list[Event]:
        """The model raised on a step: every running sequence ends (a retry would raise
        again); each gets a ``Failed`` event instead of its answer."""
        log.warning("generation step failed: %s", error)
        return self._fail([s.seq_id for s in self.policy.running], error)

    def _fail(self, seq_ids: Iterable[str], error: str) -> list[Event]:
        now = self.clock()
        failed: list[Event] = []
        for seq_id in seq_ids:
            if self.policy.cancel(seq_id, now) is not None:
                failed.append(Failed(seq_id, error, now))
        return failed

    def _apply(self, cmd: Command, sink: Sink) -> None:
        if isinstance(cmd, Cancel):
            done = self.policy.cancel(cmd.seq_id, self.clock())
            if done is not None:
                sink([done])
        elif isinstance(cmd, Attach):
            self.runner = cmd.runner
        elif isinstance(cmd, Call):
            cmd.fn(self)
        else:
            self.submit(cmd)

    def serve(
        self,
        inbox: queue.Queue[Command],
        sink: Sink,
        stop: threading.Event,
        on_step: Callable[[StepStats], None] | None = None,
        idle_wait_s: float = 0.05,
    ) -> None:
        """Run until ``stop`` is set (what is running then is left as it is)."""
        while not stop.is_set():
            if not self.ready():
                try:  # idle: block until a command comes (or look at ``stop`` again)
                    self._apply(inbox.get(timeout=idle_wait_s), sink)
                except queue.Empty:
                    continue
            while True:  # joins happen here, between steps
                try:
                    self._apply(inbox.get_nowait(), sink)
                except queue.Empty:
                    break
            if not self.ready():
                continue
            try:
                events = self.step()
            except RunnerLost as exc:
                log.warning("generation runner lost (%s); running sequences will recompute", exc)
                self.policy.drop_cache(self.clock())
                self.runner = None  # until the next one attaches
                continue
            except StepFailed as exc:
                sink(self.fail_running(str(exc)))
                continue
            if events:
                sink(events)
            if on_step is not None and self.last is not None:
                on_step(self.last)
