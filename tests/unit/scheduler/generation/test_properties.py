"""Properties over random arrival mixes: budgets hold every step, every request ends
exactly once, and what a sequence generates never depends on its neighbours,
preemptions or chunking."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.fairness import FairQueue as TokenDRR
from scheduler.core.generation.config import PolicyConfig
from scheduler.core.generation.events import Token
from scheduler.core.generation.policy import ContinuousBatcher
from scheduler.core.generation.sequence import FinishReason, GenRequest
from tests.unit.scheduler.generation.fake_model import EOS, decode, reference
from tests.unit.scheduler.generation.helpers import drive


@st.composite
def configs(draw: st.DrawFn) -> PolicyConfig:
    bs = draw(st.sampled_from([1, 2, 4, 8]))
    max_len = draw(st.integers(8, 48))
    blocks = draw(st.integers(-(-max_len // bs), 3 * max_len // bs + 2))
    budget = draw(st.integers(1, 48))
    return PolicyConfig(
        num_blocks=blocks,
        block_size=bs,
        max_step_tokens=budget,
        max_running=draw(st.integers(1, min(budget, 8))),
        max_model_len=max_len,
        kv_overcommit=draw(st.sampled_from([1.0, 1.5, math.inf])),
    )


@st.composite
def workloads(draw: st.DrawFn, cfg: PolicyConfig) -> list[tuple[int, GenRequest, int | None]]:
    n = draw(st.integers(1, 14))
    out = []
    for i in range(n):
        plen = draw(st.integers(1, cfg.max_model_len - 1))
        prompt = tuple(draw(st.lists(st.integers(1, 26), min_size=plen, max_size=plen)))
        req = GenRequest(
            seq_id=f"r{i}",
            prompt=prompt,
            max_tokens=draw(st.integers(1, 24)),
            tenant=draw(st.sampled_from("abc")),
            weight=draw(st.sampled_from([0.5, 1.0, 2.0])),
            rank=draw(st.integers(0, cfg.ranks - 1)),
            temperature=draw(st.sampled_from([0.0, 0.0, 0.8])),
            seed=draw(st.integers(0, 99)),
            deadline=draw(st.sampled_from([math.inf, math.inf, float(draw(st.integers(0, 40)))])),
        )
        cancel_at = draw(st.one_of(st.none(), st.integers(0, 60)))
        out.append((draw(st.integers(0, 30)), req, cancel_at))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), eos_every=st.sampled_from([0, 9]))
def test_random_mixes(data: st.DataObject, eos_every: int) -> None:
    cfg = data.draw(configs())
    work = data.draw(workloads(cfg))
    b = ContinuousBatcher(cfg, decode=decode, eos_id=EOS)
    run = drive(
        b,
        [(at, r) for at, r, _ in work],
        eos_every=eos_every,
        cancels=[(c, r.seq_id) for _, r, c in work if c is not None],
    )
    finished = Counter(e.seq_id for e in run.events if type(e).__name__ == "Finished")
    assert finished == Counter(r.seq_id for _, r, _ in work)  # each exactly once
    assert b.pool.used == 0 and b.reserved_blocks == 0 and not b.has_work()
    done = run.finished()
    tokens = run.tokens()
    for _, r, _ in work:
        f = done[r.seq_id]
        toks: list[Token] = tokens.get(r.seq_id, [])
        assert [t.index for t in toks] == list(range(len(toks)))
        assert "".join(t.text for t in toks) + f.tail == f.text == decode(f.token_ids)
        if f.reason is FinishReason.EXPIRED:
            assert not toks and f.finished_at >= r.deadline
            continue
        ref = reference(
            r.prompt,
            r.max_tokens,
            temperature=r.temperature,
            seed=r.seed,
            eos_every=eos_every,
            max_len=cfg.max_model_len,
        )
        if f.reason is FinishReason.CANCELLED:
            assert list(f.token_ids) == ref[: len(f.token_ids)]
        else:
            assert list(f.token_ids) == ref
            ended_by_eos = f.reason is FinishReason.STOP
            assert len(toks) == len(ref) + ended_by_eos
        if cfg.kv_overcommit == 1.0:
            assert f.preemptions == 0 or any(x.rank < r.rank for _, x, _ in work)


@dataclass(eq=False)
class Item:
    tenant: str
    weight: float
    cost: int


@settings(max_examples=200, deadline=None)
@given(
    weights=st.lists(st.sampled_from([0.25, 0.5, 1.0, 2.0, 3.0]), min_size=2, max_size=5),
    costs=st.lists(st.integers(1, 300), min_size=1, max_size=6),
    quantum=st.integers(1, 400),
    pops=st.integers(50, 400),
)
def test_drr_keeps_backlogged_tenants_within_one_turn_of_their_share(
    weights: list[float], costs: list[int], quantum: int, pops: int
) -> None:
    q = TokenDRR[Item](quantum, lambda i: i.cost)
    for k in range(pops):  # every tenant stays backlogged through all the pops
        for t, w in enumerate(weights):
            q.push(Item(f"t{t}", w, costs[(k + t) % len(costs)]))
    served = Counter[str]()
    for _ in range(pops):
        i = q.pop()
        served[i.tenant] += i.cost
    norm = [served[f"t{t}"] / w for t, w in enumerate(weights)]
    bound = quantum + max(costs) / min(weights)
    assert max(norm) - min(norm) <= bound + 1e-9
