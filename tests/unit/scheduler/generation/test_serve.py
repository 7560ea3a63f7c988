"""The step loop as production runs it (scheduler/runtime/generation/engine.py): a
runner that comes later or is replaced, a lost runner's sequences recomputed on the
next, a failed step's sequences ended with ``Failed``, and the owner's work run between
steps on the loop's own thread."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from core.generation import StepOutput, StepPlan
from scheduler.core.generation.engine import (
    Attach,
    Call,
    Command,
    Engine,
    PartFailed,
    RunnerLost,
    StepFailed,
)
from scheduler.core.generation.events import Event, Failed, Finished, Preempted
from tests.unit.scheduler.generation.fake_model import FakeRunner, reference
from tests.unit.scheduler.generation.helpers import batcher, req


class Breaks(FakeRunner):
    """A runner that raises ``exc`` on its ``at``-th step."""

    def __init__(self, at: int, exc: Exception):
        super().__init__(64, 4)
        self.at, self.exc, self.n = at, exc, 0

    def execute(self, plan: StepPlan) -> StepOutput:
        self.n += 1
        if self.n == self.at:
            raise self.exc
        return super().execute(plan)


class Loop:
    """``Engine.serve`` in a thread, its events gathered."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.inbox: queue.Queue[Command] = queue.Queue()
        self.events: list[Event] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=engine.serve, args=(self.inbox, self.sink, self.stop), daemon=True
        )
        self.thread.start()

    def sink(self, events: list[Event]) -> None:
        with self.lock:
            self.events.extend(events)

    def wait_for(self, done: Callable[[list[Event]], bool], timeout_s: float = 10) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if done(self.events):
                    return
            time.sleep(0.005)
        raise AssertionError(f"not done: {self.events[-5:]}")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        assert not self.thread.is_alive()


def finished(n: int) -> Callable[[list[Event]], bool]:
    return lambda evs: sum(isinstance(e, Finished | Failed) for e in evs) >= n


def test_requests_wait_for_a_runner_and_a_lost_one_recomputes_on_the_next() -> None:
    b = batcher(num_blocks=64, block_size=4, max_model_len=64)
    loop = Loop(Engine(b, None))
    reqs = [req(4, 20) for _ in range(3)]
    for r in reqs:
        loop.inbox.put(r)
    time.sleep(0.05)
    assert loop.events == [] and b.num_waiting == 3  # nothing runs without a runner
    lost = Breaks(3, RunnerLost("worker died"))
    loop.inbox.put(Attach(lost))
    loop.wait_for(lambda evs: lost.n == 3 and loop.engine.runner is None)  # none till another
    assert b.running == [] and b.num_waiting == 3  # every sequence waits to recompute
    loop.inbox.put(Attach(FakeRunner(64, 4)))  # a fresh KV pool: all is recomputed
    loop.wait_for(finished(3))
    loop.close()
    assert {e.seq_id for e in loop.events if isinstance(e, Preempted)} == {r.seq_id for r in reqs}
    done = {e.seq_id: e for e in loop.events if isinstance(e, Finished)}
    for r in reqs:
        assert list(done[r.seq_id].token_ids) == reference(r.prompt, 20)
    assert b.pool.used == 0


def test_a_failed_step_fails_its_sequences_and_the_loop_goes_on() -> None:
    b = batcher()
    loop = Loop(Engine(b, Breaks(2, StepFailed("CUDA error"))))
    first = [req(4, 30) for _ in range(2)]
    for r in first:
        loop.inbox.put(r)
    loop.wait_for(finished(2))
    failed = [e for e in loop.events if isinstance(e, Failed)]
    assert {e.seq_id for e in failed} == {r.seq_id for r in first}
    assert all(e.error == "CUDA error" for e in failed)
    later = req(4, 5)
    loop.inbox.put(later)
    loop.wait_for(finished(3))
    loop.close()
    end = [e for e in loop.events if isinstance(e, Finished)]
    assert [e.seq_id for e in end] == [later.seq_id]
    assert list(end[0].token_ids) == reference(later.prompt, 5) and b.pool.used == 0


class Slow(FakeRunner):
    def execute(self, plan: StepPlan) -> StepOutput:
        time.sleep(0.002)
        return super().execute(plan)


def test_the_owners_work_runs_between_steps_on_the_loops_thread() -> None:
    b = batcher(max_model_len=200)
    loop = Loop(Engine(b, Slow(64, 4)))
    r = req(4, 150, ignore_eos=True)
    seen: list[tuple[str, bool]] = []

    def look(engine: Engine) -> None:
        seen.append((threading.current_thread().name, r.seq_id in engine.policy))
        engine.policy.cancel(r.seq_id, time.time())

    loop.inbox.put(r)
    loop.wait_for(lambda evs: len(evs) >= 3)
    loop.inbox.put(Call(look))
    loop.wait_for(lambda evs: not b.has_work())
    loop.close()
    assert seen == [(loop.thread.name, True)]


class OnePartFails(FakeRunner):
    """A runner of two versions whose second version's part raises on its ``at``-th
    step: the other part's tokens come back, as WorkerRunner gives them."""

    def __init__(self, at: int, bad: set[str]):
        super().__init__(64, 4)
        self.at, self.bad, self.n = at, bad, 0

    def execute(self, plan: StepPlan) -> StepOutput:
        self.n += 1
        out = super().execute(plan)
        if self.n != self.at:
            return out
        good = {k: t for k, t in out.sampled.items() if k not in self.bad}
        hit = frozenset(c.seq_id for c in plan.chunks if c.seq_id in self.bad)
        raise PartFailed("gristmill-lm@2: boom", hit, StepOutput(plan.step, good))


def test_a_versions_failed_part_fails_only_its_sequences() -> None:
    b = batcher()
    live, canary = req(4, 12), req(4, 12)
    loop = Loop(Engine(b, OnePartFails(3, {canary.seq_id})))
    loop.inbox.put(live)
    loop.inbox.put(canary)
    loop.wait_for(finished(2))
    loop.close()
    failed = [e for e in loop.events if isinstance(e, Failed)]
    assert [(e.seq_id, e.error) for e in failed] == [(canary.seq_id, "gristmill-lm@2: boom")]
    end = [e for e in loop.events if isinstance(e, Finished)]
    assert [e.seq_id for e in end] == [live.seq_id]  # its tokens of that step kept
    assert list(end[0].token_ids) == reference(live.prompt, 12) and b.pool.used == 0
