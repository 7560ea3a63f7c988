"""Flows inside a tenant (a gateway's fairness id): the fair queue's second level
(scheduler/core/flows.py, fairness.py; decision 58)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.fairness import FairQueue
from scheduler.core.flows import Flows
from tests.unit.helpers import pending


@dataclass(eq=False)
class It:
    tenant: str
    flow: str | None = None
    weight: float = 1.0
    cost: int = 1
    name: str = ""
    consumed_at: float = 0.0
    gone: bool = False


def fill(fq: FairQueue[It], tenant: str, flow: str | None, n: int, **kw: object) -> None:
    for i in range(n):
        fq.append(It(tenant, flow, name=f"{flow}{i}", **kw))  # type: ignore[arg-type]


def tokens() -> FairQueue[It]:
    return FairQueue(16, lambda i: i.cost)


# ---- batching: requests counted ------------------------------------------------------


def test_a_flows_burst_cannot_starve_the_tenants_other_flow() -> None:
    fq: FairQueue[It] = FairQueue()
    fill(fq, "a", "burst", 10_000)
    fill(fq, "a", "quiet", 5)
    batch = fq.take(10)
    assert Counter(i.flow for i in batch) == {"burst": 5, "quiet": 5}


def test_flows_of_a_tenant_alternate_request_by_request() -> None:
    fq: FairQueue[It] = FairQueue()
    fill(fq, "a", "x", 4)
    fill(fq, "a", "y", 4)
    assert [i.name for i in fq.take(6)] == ["x0", "y0", "x1", "y1", "x2", "y2"]


def test_requests_without_an_id_are_one_flow_the_tenants_default() -> None:
    fq: FairQueue[It] = FairQueue()
    fill(fq, "a", None, 100)
    fill(fq, "a", "user-1", 3)
    c = Counter(i.flow for i in fq.take(6))
    assert c == {None: 3, "user-1": 3}


def test_flows_share_the_tenants_turn_and_the_other_tenant_keeps_its_half() -> None:
    fq: FairQueue[It] = FairQueue()
    fill(fq, "a", "burst", 1000)
    fill(fq, "a", "quiet", 1000)
    fill(fq, "b", None, 1000)
    batch = fq.take(40)
    assert Counter(i.tenant for i in batch) == {"a": 20, "b": 20}
    assert Counter(i.flow for i in batch if i.tenant == "a") == {"burst": 10, "quiet": 10}


def test_many_flows_gain_a_tenant_nothing_against_a_weighted_tenant() -> None:
    fq: FairQueue[It] = FairQueue()
    for f in range(50):
        fill(fq, "many", f"u{f}", 100)
    fill(fq, "gold", None, 5000, weight=3.0)
    c = Counter(i.tenant for i in fq.take(400))
    assert c == {"gold": 300, "many": 100}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 30), min_size=1, max_size=300),
    st.integers(1, 200),
    st.integers(1, 50),
)
def test_a_tenant_serves_the_same_share_however_many_flows_it_uses(
    flows: list[int], n: int, batch: int
) -> None:
    """The order tenants are served in is the same whether a tenant's requests carry
    one flow or hundreds: flows only pick which of its requests goes."""

    def served(split: bool) -> list[str]:
        fq: FairQueue[It] = FairQueue()
        for f in flows:
            fq.append(It("many", f"u{f}" if split else None))
            fq.append(It("one"))
        for _ in range(n // 3):
            fq.append(It("one"))
        out: list[str] = []
        while fq:
            out += [i.tenant for i in fq.take(batch)]
        return out

    assert served(True) == served(False)


def test_an_idle_flow_banks_no_credit() -> None:
    fq: FairQueue[It] = FairQueue()
    fill(fq, "a", "x", 200)
    fill(fq, "a", "y", 1)
    fq.take(2)  # x0, y0: y is drained and idle
    fq.take(20)  # x alone: nothing to bank for y
    fill(fq, "a", "y", 10)
    assert [i.flow for i in fq.take(6)] == ["x", "y", "x", "y", "x", "y"]


def test_fifo_within_a_flow_and_gone_items_skipped() -> None:
    fq: FairQueue[It] = FairQueue()
    xs = [It("a", "x", name=f"x{i}", consumed_at=float(10 + i)) for i in range(4)]
    ys = [It("a", "y", name=f"y{i}", consumed_at=float(20 + i)) for i in range(4)]
    for i in xs + ys:
        fq.append(i)
    xs[0].gone = ys[1].gone = True
    assert fq.oldest_at() == 11.0
    assert {h.name for h in fq.heads()} == {"x1", "y0"}  # every flow's oldest live item
    assert [i.name for i in fq.take(10)] == ["x1", "y0", "x2", "y2", "x3", "y3"]
    assert not fq and fq.tenants() == 0


def test_remove_takes_an_item_out_of_its_flow() -> None:
    fq: FairQueue[It] = FairQueue()
    x, y = It("a", "x"), It("a", "y")
    fq.append(x)
    fq.append(y)
    fq.remove(y)
    assert fq.take(5) == [x] and fq.tenants() == 0
    fq.append(y)
    fq.remove(y)
    assert fq.tenants() == 0 and not fq


def test_depth_by_tenant_counts_all_its_flows() -> None:
    fq: FairQueue[It] = FairQueue()
    fill(fq, "a", "x", 3, weight=2.0)
    fill(fq, "a", "y", 4, weight=2.0)
    assert fq.depth_by_tenant() == {"a": (7, 2.0)} and len(fq) == 7


def test_the_batchers_requests_carry_their_fairness_id_as_their_flow() -> None:
    p = pending()
    assert p.flow is None
    p.msg.fairness_id = "user-9"
    assert p.flow == "user-9"


# ---- generation: tokens counted --------------------------------------------------------


def served_tokens(fq: FairQueue[It], n: int, by: str) -> Counter[str | None]:
    """Tokens of the next ``n`` items popped, by their ``by`` (tenant or flow)."""
    served: Counter[str | None] = Counter()
    for _ in range(n):
        i = fq.pop()
        served[getattr(i, by)] += i.cost
    return served


def test_flows_share_the_tenants_tokens_not_its_requests() -> None:
    fq = tokens()
    fill(fq, "a", "long", 100, cost=400)
    fill(fq, "a", "short", 400, cost=100)
    served = served_tokens(fq, 200, "flow")
    assert abs(served["long"] - served["short"]) <= 400 + 16


def test_a_flow_of_long_requests_does_not_take_the_tenants_share_from_another_tenant() -> None:
    fq = tokens()
    fill(fq, "a", "long", 100, cost=400)
    fill(fq, "a", "short", 400, cost=100)
    fill(fq, "b", None, 400, cost=100)
    served = served_tokens(fq, 300, "tenant")
    assert abs(served["a"] - served["b"]) <= 400 + 16


def test_peek_is_stable_until_pop_across_flows() -> None:
    fq = tokens()
    fill(fq, "a", "x", 5, cost=50)
    fill(fq, "a", "y", 5, cost=30)
    fill(fq, "b", None, 5, cost=40)
    for _ in range(15):
        first = fq.peek()
        assert fq.peek() is first and fq.peek() is first
        assert fq.pop() is first
    assert fq.peek() is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 5), st.integers(1, 600)), max_size=200)
)
def test_every_token_item_is_served_once_and_fifo_in_its_flow(
    items: list[tuple[str, int, int]],
) -> None:
    fq = tokens()
    made = [It(t, f"u{f}", cost=c, name=str(k)) for k, (t, f, c) in enumerate(items)]
    for i in made:
        fq.push(i)
    out = []
    while fq.peek() is not None:
        out.append(fq.pop())
    assert sorted(out, key=lambda i: int(i.name)) == made
    for flow in {(i.tenant, i.flow) for i in made}:
        mine = [int(i.name) for i in out if (i.tenant, i.flow) == flow]
        assert mine == sorted(mine)


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 40), st.integers(1, 8))
def test_many_flows_gain_no_tokens_against_a_tenant_of_one(n_flows: int, per_flow: int) -> None:
    fq = tokens()
    for f in range(n_flows):
        fill(fq, "many", f"u{f}", per_flow, cost=100)
    fill(fq, "one", None, n_flows * per_flow, cost=100)
    served = served_tokens(fq, n_flows * per_flow, "tenant")  # both stay backlogged
    assert abs(served["many"] - served["one"]) <= 100


# ---- the flows of one tenant on their own ---------------------------------------------


def test_a_lone_flow_is_fifo_and_starts_fresh_when_a_second_arrives() -> None:
    fl: Flows[It] = Flows(16, lambda i: i.cost, lazy=False)
    for k in range(3):
        fl.append(It("a", "x", cost=100, name=f"x{k}"), "x")
    assert fl.pop().name == "x0"  # no credit needed while it is alone
    fl.append(It("a", "y", cost=100, name="y0"), "y")
    assert [fl.pop().name for _ in range(3)] == ["x1", "y0", "x2"]
    assert fl.head() is None and fl.flows() == 0
