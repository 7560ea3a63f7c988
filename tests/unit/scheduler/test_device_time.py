"""Fairness in device time (decision 65): the length model, the split of a batch's measured
time, the fair queue charging it, the received/entitled ledger and earliest deadline first
inside a flow. The shapes here (lengths, costs, weights) are not the benchmark's."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from core.models.token_ids import input_tokens, tokenized_input
from scheduler.core.batcher import Batcher, FlushPolicy, Pending
from scheduler.core.charging import batch_shares, charge
from scheduler.core.costmodel import CostModel
from scheduler.core.fairness import FairQueue
from scheduler.core.itemcost import ItemCosts, bucket, split
from scheduler.core.shares import HALF_LIFE_S, Shares, entitled, jain
from scheduler.runtime.metrics.gauges import fairness_families
from tests.unit.helpers import pending

REF = "m"


def true_ms(padded: list[int], per_item: float, per_token: float, rnd: random.Random) -> float:
    """A batch's compute on a made-up device, with a few percent of timing noise."""
    return sum(per_item + per_token * p for p in padded) * rnd.uniform(0.97, 1.03)


def test_the_length_model_learns_both_terms_from_varied_batches() -> None:
    rnd = random.Random(7)
    costs = ItemCosts()
    for _ in range(200):
        padded = [bucket(rnd.choice((5, 40, 120, 300))) for _ in range(rnd.randint(3, 40))]
        costs.observe(REF, padded, true_ms(padded, 0.9, 0.02, rnd))
    a, b = costs.terms(REF) or (0, 0)
    assert a == pytest.approx(0.9, rel=0.1) and b == pytest.approx(0.02, rel=0.1)
    # what the fair queue charges: a 304-token item against an 8-token one, as the device
    want = (0.9 + 0.02 * 304) / (0.9 + 0.02 * 8)
    assert costs.relative(REF, 304) / costs.relative(REF, 8) == pytest.approx(want, rel=0.1)


def test_batches_all_of_one_mix_put_the_cost_on_tokens() -> None:
    costs = ItemCosts()
    for n in (4, 8, 16, 32):  # every batch one length: items and tokens rise together
        costs.observe(REF, [64] * n, 3.0 * n)
    assert costs.terms(REF) == pytest.approx((0.0, 3.0 / 64))
    assert costs.relative(REF, 64) == pytest.approx(1.0)  # one length: one an item
    assert costs.relative(REF, 128) == pytest.approx(2.0)


def test_a_fit_the_noise_decides_is_not_trusted() -> None:
    rnd = random.Random(11)
    costs = ItemCosts()
    for _ in range(128):  # one mix, sizes varying, 10% timing noise: the counted rule
        k = rnd.randint(3, 17)
        padded = [16] * k + [200] * k + ([16] if rnd.random() < 0.5 else [])
        costs.observe(REF, padded, true_ms(padded, 0.5, 0.1, rnd) * rnd.uniform(0.9, 1.1))
    a, b = costs.terms(REF) or (1, 0)
    assert a == 0.0 and b == pytest.approx(0.5 * 2 / 216 + 0.1, rel=0.05)


def test_before_any_batch_items_are_priced_by_padded_length() -> None:
    costs = ItemCosts()
    assert costs.relative(REF, bucket(3)) == 1.0
    assert costs.relative(REF, bucket(250)) == 32.0


def test_a_batch_time_is_split_in_proportion_and_adds_up() -> None:
    parts = split(90.0, [1.0, 2.0, 6.0])
    assert parts == pytest.approx([10.0, 20.0, 60.0]) and sum(parts) == pytest.approx(90.0)
    assert split(10.0, [0.0, 0.0]) == [5.0, 5.0]
    assert split(10.0, []) == []


def test_input_tokens_counts_ids_words_or_one() -> None:
    assert input_tokens(tokenized_input("a b", [101, 1, 2, 102])) == 4
    assert input_tokens("three short words") == 5  # and [CLS], [SEP]
    assert input_tokens([0.1, 0.2]) == 1
    assert bucket(1) == 8 and bucket(8) == 8 and bucket(9) == 16


def item(tenant: str, words: int, weight: float = 1.0, deadline: float = 100.0) -> Pending:
    p = pending(input_=" ".join(["w"] * words), deadline=deadline)
    p.msg.tenant_id = tenant
    p.msg.weight = weight
    return p


def served(
    lengths: dict[str, int],
    weights: dict[str, float],
    by_device_time: bool,
    batches: int = 400,
    size: int = 24,
) -> dict[str, float]:
    """Device seconds each backlogged tenant received over ``batches`` batches of a made-up
    device (per item 1.5 ms + 0.04 ms a token), every batch's time charged as measured."""
    rnd = random.Random(3)
    costs, shares = ItemCosts(), Shares()
    b = Batcher(
        policy=FlushPolicy(),
        cost=CostModel(),
        max_batch=lambda _ref: size,
        prices=costs if by_device_time else None,
    )
    got: Counter[str] = Counter()
    for k in range(batches):
        for t, words in lengths.items():  # top up: every tenant stays backlogged
            while sum(1 for p in b._queues.values() for p in p.by_rank[0] if p.tenant == t) < 30:
                b.add(item(t, words, weights[t]))
        batch = b.take(float(k), lambda _ref: True)
        assert batch is not None
        ms = true_ms([p.padded for p in batch.items], 1.5, 0.04, rnd)
        charge(costs, shares, batch, ms, float(k))
        if k >= batches // 4:  # after the length model has seen some batches
            for p in batch.items:
                got[p.tenant] += p.padded * 0.04 + 1.5  # the device's own cost, not the split
    return {t: got[t] for t in lengths}


def test_equal_weights_get_equal_device_time_whatever_the_lengths() -> None:
    got = served({"terse": 10, "verbose": 180}, {"terse": 1, "verbose": 1}, True)
    assert got["terse"] / got["verbose"] == pytest.approx(1.0, abs=0.1)


def test_batches_smaller_than_a_turn_do_not_cut_the_cheap_tenants_share() -> None:
    # a 10-word input costs a small part of a turn, so a batch of 3 ends mid-turn
    got = served({"terse": 10, "verbose": 180}, {"terse": 1, "verbose": 1}, True, size=3)
    assert got["terse"] / got["verbose"] == pytest.approx(1.0, abs=0.1)


def test_a_weight_buys_device_time() -> None:
    got = served({"gold": 150, "basic": 20}, {"gold": 3, "basic": 1}, True)
    assert got["gold"] / got["basic"] == pytest.approx(3.0, rel=0.1)


def test_counting_requests_gives_long_inputs_the_device() -> None:
    got = served({"terse": 10, "verbose": 180}, {"terse": 1, "verbose": 1}, False)
    assert got["verbose"] / got["terse"] > 4  # what decision 65 replaced


def test_each_batch_is_owed_to_the_backlogged_by_weight() -> None:
    assert entitled(6.0, {"a": 1.0, "b": 2.0}) == pytest.approx({"a": 2.0, "b": 4.0})
    assert entitled(6.0, {}) == {}
    s = Shares()
    # "b" was backlogged but got nothing of this batch: owed half, received none
    s.charge(10.0, "paid", {"a": 4.0}, {"a": 1.0, "b": 1.0})
    snap = s.snapshot()
    rows = {r.tenant: r for r in snap.tenants}
    assert (rows["a"].received_s, rows["a"].entitled_s) == (4.0, 2.0)
    assert (rows["b"].received_s, rows["b"].entitled_s) == (0.0, 2.0)
    assert rows["a"].received_share == 1.0 and rows["b"].entitled_share == 0.5
    assert snap.index["paid"] == pytest.approx(0.5)  # one of two got it all


def test_recent_shares_forget_old_batches_and_totals_do_not() -> None:
    s = Shares(start=0.0)
    s.charge(0.0, "free", {"a": 10.0}, {"a": 1.0})
    later = 20 * HALF_LIFE_S  # long past; the reference time is rebased on the way
    for k in range(50):
        s.charge(later + k, "free", {"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 1.0})
    snap = s.snapshot()
    rows = {r.tenant: r for r in snap.tenants}
    assert rows["a"].received_s == pytest.approx(60.0)
    assert rows["a"].received_share == pytest.approx(0.5, abs=1e-3)
    assert snap.index["free"] == pytest.approx(1.0)


def test_jain() -> None:
    assert jain([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain([3.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert jain([]) == 1.0


def test_a_batch_row_holds_received_and_owed_per_tier_and_tenant() -> None:
    costs, shares = ItemCosts(), Shares()
    b = Batcher(policy=FlushPolicy(), cost=CostModel(), max_batch=lambda _ref: 3, prices=costs)
    for t, words in (("a", 5), ("a", 5), ("c", 60)):
        b.add(item(t, words))
    b.add(item("idle", 5))  # queued, and left for the next batch: owed, not received
    batch = b.take(0.0, lambda _ref: True)
    assert batch is not None and len(batch.items) == 3
    charge(costs, shares, batch, 80.0, 0.0)
    row = batch_shares(batch)["enterprise"]
    # a 64-token input costs 8 of a turn's credit of 1 before any batch was measured:
    # "a" and "idle" take the batch, "c" is owed its third and received nothing
    assert sorted(p.tenant for p in batch.items) == ["a", "a", "idle"]
    assert row["c"] == [0.0, pytest.approx(80.0 / 3, abs=0.01)]
    assert sum(v[0] for v in row.values()) == pytest.approx(80.0, abs=0.01)
    assert sum(v[1] for v in row.values()) == pytest.approx(80.0, abs=0.01)
    assert row["a"][0] == pytest.approx(2 * row["idle"][0], abs=0.01)


def test_earliest_deadline_first_inside_a_flow_and_arrival_order_on_ties() -> None:
    fq: FairQueue[Pending] = FairQueue(order=lambda p: p.msg.deadline)
    late, soon, soon2, mid = (item("a", 3, deadline=d) for d in (90.0, 10.0, 10.0, 50.0))
    for p in (late, soon, soon2, mid):
        fq.append(p)
    assert fq.take(4) == [soon, soon2, mid, late]


def test_earliest_deadline_first_keeps_the_turns_between_tenants() -> None:
    fq: FairQueue[Pending] = FairQueue(order=lambda p: p.msg.deadline)
    for d in (5.0, 4.0, 3.0, 2.0):
        fq.append(item("a", 3, deadline=d))
    fq.append(item("b", 3, deadline=99.0))
    out = fq.take(2)
    assert [(p.tenant, p.msg.deadline) for p in out] == [("a", 2.0), ("b", 99.0)]
    out[0].gone = True  # a gone head is passed over in deadline order too
    left = fq.take(3)
    assert [p.msg.deadline for p in left] == [3.0, 4.0, 5.0]


def test_the_exports_name_tier_tenant_and_kind() -> None:
    s = Shares()
    s.charge(1.0, "paid", {"a": 3.0, "b": 1.0}, {"a": 1.0, "b": 1.0})
    fams = {f.name: f for f in fairness_families(s.snapshot())}
    counter = fams["gristmill_tenant_device_seconds"]
    received = {tuple(x.labels.values()): x.value for x in counter.samples}
    assert received[("paid", "a")] == 3.0
    share = {
        (x.labels["tenant"], x.labels["kind"]): x.value
        for x in fams["gristmill_tenant_device_share"].samples
    }
    assert share[("a", "received")] == 0.75 and share[("a", "entitled")] == 0.5
    index = fams["gristmill_fairness_index"].samples[0].value
    assert index == pytest.approx(jain([1.5, 0.5]))


def test_tenants_past_the_series_limit_are_summed_as_other() -> None:
    s = Shares()
    s.charge(
        1.0, "free", {t: float(i + 1) for i, t in enumerate("abcde")}, dict.fromkeys("abcde", 1.0)
    )
    fams = {f.name: f for f in fairness_families(s.snapshot(), limit=2)}
    got = {x.labels["tenant"]: x.value for x in fams["gristmill_tenant_device_seconds"].samples}
    assert got == {"e": 5.0, "d": 4.0, "other": 6.0}
