"""Builders and a driver for tests of the continuous-batching policy."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from core.generation import StepPlan
from scheduler.core.generation.config import PolicyConfig
from scheduler.core.generation.events import Event, Finished, Preempted, Token
from scheduler.core.generation.policy import ContinuousBatcher
from scheduler.core.generation.sequence import GenRequest
from tests.unit.scheduler.generation.fake_model import EOS, FakeRunner, decode

_ids = itertools.count()


def req(
    prompt_len: int = 4, max_tokens: int = 8, *, seq_id: str | None = None, **kw: object
) -> GenRequest:
    n = next(_ids)
    prompt = tuple(1 + (n * 5 + i) % 26 for i in range(prompt_len))
    return GenRequest(seq_id=seq_id or f"s{n}", prompt=prompt, max_tokens=max_tokens, **kw)  # type: ignore[arg-type]


def batcher(eos: int | None = EOS, **cfg: object) -> ContinuousBatcher:
    base: dict[str, object] = {
        "num_blocks": 64,
        "block_size": 4,
        "max_step_tokens": 32,
        "max_running": 8,
        "max_model_len": 64,
    }
    base.update(cfg)
    return ContinuousBatcher(PolicyConfig(**base), decode=decode, eos_id=eos)  # type: ignore[arg-type]


@dataclass
class Run:
    """Everything a driven policy did."""

    plans: list[StepPlan] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    by_step: list[list[Event]] = field(default_factory=list)

    def finished(self) -> dict[str, Finished]:
        return {e.seq_id: e for e in self.events if isinstance(e, Finished)}

    def tokens(self) -> dict[str, list[Token]]:
        out: dict[str, list[Token]] = defaultdict(list)
        for e in self.events:
            if isinstance(e, Token):
                out[e.seq_id].append(e)
        return out

    def preempted(self) -> list[str]:
        return [e.seq_id for e in self.events if isinstance(e, Preempted)]

    def scheduled(self, seq_id: str) -> list[int]:
        """Steps of this run (1-based) in which ``seq_id`` had a chunk."""
        return [i for i, p in enumerate(self.plans, 1) if any(c.seq_id == seq_id for c in p.chunks)]


def drive(
    b: ContinuousBatcher,
    arrivals: Iterable[tuple[int, GenRequest]] = (),
    *,
    eos_every: int = 0,
    max_steps: int = 10_000,
    check: bool = True,
    cancels: Iterable[tuple[int, str]] = (),
) -> Run:
    """Step the policy (time = step number) with a FakeRunner until nothing is left;
    ``arrivals``: (step before which it is added, request). With ``check``, every
    step's invariants are asserted."""
    runner = FakeRunner(b.cfg.num_blocks, b.cfg.block_size, eos_every)
    pending = sorted(arrivals, key=lambda a: a[0])
    to_cancel = sorted(cancels)
    run = Run()
    step = 0
    while (pending or b.has_work()) and step < max_steps:
        while pending and pending[0][0] <= step:
            b.add(pending.pop(0)[1])
        while to_cancel and to_cancel[0][0] <= step:
            done = b.cancel(to_cancel.pop(0)[1], float(step))
            if done is not None:
                run.events.append(done)
        plan = b.schedule(float(step))
        out = runner.execute(plan)
        events = b.update(plan, out, float(step))
        run.plans.append(plan)
        run.events.extend(events)
        run.by_step.append(events)
        if check:
            assert_invariants(b, plan)
        step += 1
    assert step < max_steps, "the policy did not finish"
    return run


def assert_invariants(b: ContinuousBatcher, plan: StepPlan) -> None:
    cfg = b.cfg
    assert plan.num_tokens <= cfg.max_step_tokens
    assert len(b.running) <= cfg.max_running
    held = [blk for s in b.running for blk in s.blocks]
    assert len(held) == len(set(held)), "a block is held by two sequences"
    assert len(held) == b.pool.used <= cfg.num_blocks
    assert len(plan.chunks) == len({c.seq_id for c in plan.chunks})
    for c in plan.chunks:
        assert len(c.blocks) * cfg.block_size >= c.start + len(c.tokens)
