"""Token-cost deficit round robin among the tenants of one rank."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

from scheduler.core.fairness import FairQueue as TokenDRR


@dataclass(eq=False)
class Item:
    tenant: str
    cost: int
    weight: float = 1.0
    name: str = ""


def drr(quantum: int = 100) -> TokenDRR[Item]:
    return TokenDRR(quantum, lambda i: i.cost)


def drain(q: TokenDRR[Item], n: int) -> list[Item]:
    return [q.pop() for _ in range(n)]


def test_equal_costs_alternate_tenants_even_behind_a_burst() -> None:
    q = drr(100)
    for i in range(50):
        q.push(Item("burst", 100, name=f"b{i}"))
    for i in range(3):
        q.push(Item("quiet", 100, name=f"q{i}"))
    names = [i.name for i in drain(q, 6)]
    assert names[:6] == ["b0", "q0", "b1", "q1", "b2", "q2"]


def test_shares_are_counted_in_tokens_not_requests() -> None:
    q = drr(100)
    for _ in range(100):
        q.push(Item("long", 400))
        q.push(Item("short", 100))
    taken = drain(q, 100)
    tokens = Counter[str]()
    for i in taken:
        tokens[i.tenant] += i.cost
    assert abs(tokens["long"] - tokens["short"]) <= 400
    assert Counter(i.tenant for i in taken)["short"] > 3 * Counter(i.tenant for i in taken)["long"]


def test_weight_two_gets_twice_the_tokens() -> None:
    q = drr(100)
    for _ in range(300):
        q.push(Item("gold", 50, weight=2.0))
        q.push(Item("std", 50, weight=1.0))
    c = Counter(i.tenant for i in drain(q, 300))
    assert c["gold"] == pytest.approx(2 * c["std"], rel=0.05)


def test_peek_is_idempotent_and_pop_takes_what_peek_showed() -> None:
    q = drr(10)
    a, b = Item("a", 35), Item("b", 5)
    q.push(a)
    q.push(b)
    first = q.peek()
    assert q.peek() is first and q.peek() is first
    assert q.pop() is first
    assert len(q) == 1


def test_tiny_weight_and_big_cost_do_not_loop_round_by_round() -> None:
    q = drr(1)
    q.push(Item("slow", 10**9, weight=1e-3))
    q.push(Item("other", 10**9, weight=1e-3))
    assert q.pop().tenant == "slow"  # 10**12 rounds, skipped in one go
    assert q.pop().tenant == "other"
    assert q.peek() is None


def test_an_idle_tenant_banks_no_credit() -> None:
    q = drr(100)
    q.push(Item("a", 100))
    q.pop()
    for _ in range(3):
        q.push(Item("b", 100))
    q.push(Item("a", 100))
    names = [i.tenant for i in drain(q, 4)]
    assert names.count("a") == 1 and names.index("a") <= 1


def test_remove_and_empty() -> None:
    q = drr()
    x, y = Item("a", 10), Item("a", 10)
    q.push(x)
    q.push(y)
    q.remove(x)
    assert list(q) == [y]
    q.remove(y)
    assert len(q) == 0 and q.peek() is None
    with pytest.raises(IndexError):
        q.pop()
