"""The step loop: run the policy against a model, one step at a time.

``Engine.step`` is schedule -> execute -> update. ``Engine.serve`` is the loop a
service runs in one thread that owns the policy (no locks around it): between steps
it drains an inbox of commands (new requests, cancellations), so sequences join the
running batch at the next step; it hands each step's events to a sink; when there
is nothing to compute it blocks on the inbox. The runner is anything with
``execute(plan) -> StepOutput``: the model in this process
(workers/models/causal_lm/runner.py) or a proxy to a worker process.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from core.generation import StepOutput, StepPlan
from scheduler.core.generation.events import Event
from scheduler.core.generation.policy import ContinuousBatcher, InvalidRequest
from scheduler.core.generation.sequence import GenRequest

Clock = Callable[[], float]
Sink = Callable[[list[Event]], None]


class StepRunner(Protocol):
    def execute(self, plan: StepPlan) -> StepOutput: ...


@dataclass(frozen=True, slots=True)
class Cancel:
    seq_id: str


Command = GenRequest | Cancel


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
        self, policy: ContinuousBatcher, runner: StepRunner, clock: Clock = time.monotonic
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

    def step(self) -> list[Event]:
        t0 = self.clock()
        plan = self.policy.schedule(t0)
        out = self.runner.execute(plan) if plan.chunks else StepOutput(plan.step)
        events = self.policy.update(plan, out, self.clock())
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

    def _apply(self, cmd: Command, sink: Sink) -> None:
        if isinstance(cmd, Cancel):
            done = self.policy.cancel(cmd.seq_id, self.clock())
            if done is not None:
                sink([done])
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
            if not self.policy.has_work():
                try:  # idle: block until a command comes (or look at ``stop`` again)
                    self._apply(inbox.get(timeout=idle_wait_s), sink)
                except queue.Empty:
                    continue
            while True:  # joins happen here, between steps
                try:
                    self._apply(inbox.get_nowait(), sink)
                except queue.Empty:
                    break
            events = self.step()
            if events:
                sink(events)
            if on_step is not None and self.last is not None:
                on_step(self.last)
