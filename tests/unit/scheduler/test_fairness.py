"""Deficit round robin among tenants of one tier."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.batcher import Batcher, FlushPolicy
from scheduler.core.costmodel import CostModel
from scheduler.core.fairness import FairQueue
from tests.unit.helpers import pending


@dataclass(eq=False)
class It:
    tenant: str
    weight: float = 1.0
    consumed_at: float = 0.0
    gone: bool = False


def test_burst_cannot_crowd_out_a_quiet_tenant() -> None:
    fq: FairQueue[It] = FairQueue()
    for _ in range(50_000):
        fq.append(It("noisy"))
    for _ in range(10):
        fq.append(It("quiet"))
    batch = fq.take(100)
    c = Counter(i.tenant for i in batch)
    assert c["quiet"] == 10 and c["noisy"] == 90


def test_equal_weights_share_equally() -> None:
    fq: FairQueue[It] = FairQueue()
    for t in "abc":
        for _ in range(100):
            fq.append(It(t))
    c = Counter(i.tenant for i in fq.take(30))
    assert c == {"a": 10, "b": 10, "c": 10}


def test_weights_set_the_share() -> None:
    fq: FairQueue[It] = FairQueue()
    for _ in range(1000):
        fq.append(It("gold", weight=3.0))
        fq.append(It("basic", weight=1.0))
    c = Counter(i.tenant for i in fq.take(400))
    assert c["gold"] == 300 and c["basic"] == 100


def test_fifo_within_a_tenant_and_gone_items_skipped() -> None:
    fq: FairQueue[It] = FairQueue()
    items = [It("a", consumed_at=float(i)) for i in range(5)]
    for i in items:
        fq.append(i)
    items[0].gone = True
    assert fq.oldest_at() == 1.0
    assert fq.take(10) == items[1:]
    assert not fq


def test_fractional_weight_still_progresses() -> None:
    fq: FairQueue[It] = FairQueue()
    for _ in range(10):
        fq.append(It("slow", weight=0.25))
    assert len(fq.take(10)) == 10


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.sampled_from("abcdef"), st.integers(1, 60), min_size=1), st.integers(1, 50)
)
def test_property_take_is_fair_and_loses_nothing(sizes: dict[str, int], n: int) -> None:
    fq: FairQueue[It] = FairQueue()
    for t, k in sizes.items():
        for _ in range(k):
            fq.append(It(t))
    total = sum(sizes.values())
    first = True
    seen = 0
    while fq:
        batch = fq.take(n)
        assert 1 <= len(batch) <= n
        if first and min(sizes.values()) >= n:
            # everyone had plenty: equal weights give shares within one of each other
            c = Counter(i.tenant for i in batch)
            shares = [c.get(t, 0) for t in sizes]
            assert max(shares) - min(shares) <= 1
        first = False
        seen += len(batch)
    assert seen == total


def test_batcher_shares_a_batch_between_tenants_of_a_tier() -> None:
    b = Batcher(policy=FlushPolicy(), cost=CostModel(default_ms=10), max_batch=lambda r: 20)
    for _ in range(1000):
        p = pending(at=0.0)
        p.msg.tenant_id = "noisy"
        b.add(p)
    for _ in range(5):
        p = pending(at=0.5)
        p.msg.tenant_id = "quiet"
        b.add(p)
    batch = b.take(1.0, lambda ref: True)
    assert batch is not None
    assert Counter(p.msg.tenant_id for p in batch.items)["quiet"] == 5
