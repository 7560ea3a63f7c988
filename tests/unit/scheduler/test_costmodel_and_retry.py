"""Online compute prediction and the failure plan for poison inputs."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.config import Settings
from scheduler.core.costmodel import (
    CONFIRMED,
    DEFAULT_BUDGET_MS,
    NEAR_BEST,
    REPROBE_EVERY,
    SAMPLES_KEPT,
    CostModel,
)
from scheduler.core.retry import RetryPolicy, plan_failure
from tests.unit.helpers import pending

REF = ("m", "1")


def test_unknown_model_uses_default() -> None:
    assert CostModel(default_ms=42).predict_ms(REF, 8) == 42


def test_seeded_profile_interpolates_flat_below_and_proportional_above() -> None:
    c = CostModel()
    c.seed(REF, {2: 10.0, 100: 110.0})
    assert c.predict_ms(REF, 1) == 10.0
    assert c.predict_ms(REF, 50) == pytest.approx(10 + 48 / 98 * 100)
    assert c.predict_ms(REF, 200) == pytest.approx(220.0)  # no larger batch comes for free


def test_a_measured_size_is_the_median_of_its_recent_batches() -> None:
    c = CostModel()
    c.seed(REF, {8: 100.0})
    for ms in (50.0, 52.0, 900.0, 51.0, 49.0):  # one slow batch among five
        c.observe(REF, 8, ms)
    assert c.predict_ms(REF, 8) == 51.0
    c.seed(REF, {8: 1.0})  # a later warm-up does not overwrite what was measured
    assert c.predict_ms(REF, 8) == 51.0


def test_old_samples_leave_the_window() -> None:
    c = CostModel()
    for _ in range(SAMPLES_KEPT):
        c.observe(REF, 4, 10.0)
    for _ in range(SAMPLES_KEPT // 2 + 1):
        c.observe(REF, 4, 30.0)  # the host got slower: the majority now says so
    assert c.predict_ms(REF, 4) == 30.0


def test_several_workers_warming_up_keep_the_fastest_reading() -> None:
    c = CostModel()
    c.seed(REF, {16: 583.0})
    c.seed(REF, {16: 120.0})
    assert c.predict_ms(REF, 16) == 120.0


def test_failed_batch_is_split_in_halves() -> None:
    items = [pending() for _ in range(5)]
    plan = plan_failure(items, RetryPolicy())
    assert [len(g) for g in plan.retry_groups] == [2, 3]
    assert plan.failed == [] and plan.retry_delay_s == 0


def test_lone_item_retried_then_failed() -> None:
    p = pending()
    policy = RetryPolicy(max_attempts=3)
    rng = random.Random(1)
    first = plan_failure([p], policy, rng)
    assert first.retry_groups == [[p]] and 0 <= first.retry_delay_s <= policy.base_delay_s
    second = plan_failure([p], policy, rng)
    assert second.retry_groups == [[p]]
    third = plan_failure([p], policy, rng)
    assert third.failed == [p] and third.retry_groups == []


def test_poison_isolated_in_log_steps() -> None:
    items = [pending() for _ in range(16)]
    poison = items[11]
    policy = RetryPolicy(max_attempts=2)
    queue = [items]
    failed, rounds = [], 0
    while queue:
        group = queue.pop()
        rounds += 1
        if poison not in group:
            continue  # this sub-batch succeeds
        plan = plan_failure(group, policy)
        queue.extend(plan.retry_groups)
        failed.extend(plan.failed)
    assert failed == [poison]
    assert rounds < 16 * 2


def test_backoff_is_capped() -> None:
    policy = RetryPolicy(base_delay_s=1, max_delay_s=3)
    assert all(policy.delay_s(10, random.Random(i)) <= 3 for i in range(50))


# ---- the batch size: the most items/s within the budget, kept current online ----------

GPU_CURVE = {1: 0.44, 8: 1.3, 64: 4.0, 256: 12.2, 512: 20.3, 1024: 38.6}


def target(profile: dict[int, float], cap: int, budget: float) -> int:
    c = CostModel(budget_ms=budget)
    c.seed(REF, profile)
    return c.batch_target(REF, cap)


def test_largest_batch_when_it_is_fastest_and_fits() -> None:
    assert target(GPU_CURVE, 1024, 465) == 1024


def test_budget_caps_the_batch() -> None:
    # 1024 takes 38.6 ms: over a 25 ms budget; the curve between 512 (20.3 ms) and 1024
    # reaches 25 ms at 643.
    n = target(GPU_CURVE, 1024, 25)
    c = CostModel()
    c.seed(REF, GPU_CURVE)
    assert n == 643 and c.predict_ms(REF, n) <= 25 < c.predict_ms(REF, n + 1)


def test_a_curve_that_bends_picks_the_faster_smaller_batch() -> None:
    cpu = {1: 10.0, 16: 80.0, 32: 300.0, 64: 700.0}  # 200/s at 16, 107/s at 32
    assert target(cpu, 64, 1000) == 16


def test_the_workers_cap_is_respected() -> None:
    assert target(GPU_CURVE, 300, 465) == 300


def test_flat_curve_takes_the_whole_batch() -> None:
    assert target({1: 100.0, 100: 100.0}, 100, 465) == 100


def test_flat_curve_slower_than_the_budget_still_takes_the_whole_batch() -> None:
    # sim at 500 ms: every size costs what a batch of one does, so the budget cannot be
    # met by any size and the largest is as fast as the smallest (it was 1 before).
    assert target({1: 500.0, 256: 500.0}, 256, 465) == 256
    assert target({1: 2000.0, 1024: 2010.0}, 1024, 465) == 1024  # within timing noise


def test_noise_does_not_pick_a_small_batch_over_a_nearly_as_fast_large_one() -> None:
    # The dev box's CPU curve: 4 wins by 4% over 16 (noise); the largest size whose
    # interpolated cost fits the budget (31, between 16 and 32) is taken.
    cpu = {1: 120.7, 2: 46.6, 4: 72.1, 8: 152.3, 16: 299.4, 32: 465.1, 256: 2784.0}
    assert target(cpu, 256, 465) == 31


def test_model_slower_than_the_budget_runs_its_smallest_batch() -> None:
    assert target({1: 900.0, 4: 3000.0}, 4, 465) == 1


def test_no_profile_keeps_the_workers_cap() -> None:
    assert target({}, 64, 465) == 64


def test_sizes_past_the_largest_measured_are_not_taken_on_trust() -> None:
    assert target({1: 10.0, 4: 20.0}, 256, 465) == 4


def test_a_slow_warm_up_is_corrected_by_probing_larger_batches_under_backlog() -> None:
    # The warm-up: 126 ms for 1, 583 ms for 16, taken while the host was busy.
    c = CostModel(budget_ms=465)
    c.seed(REF, {1: 126.0, 2: 150.0, 4: 200.0, 8: 300.0, 16: 583.0, 256: 9000.0})
    first = c.batch_target(REF, 256)
    assert first <= 16 and c.throughput(REF, 256) < 45  # what the warm-up implies
    sizes = []
    for _ in range(40):  # a backlog: 1,000 items wait; the real curve is 10 + 6.5 ms/item
        n = c.batch_size(REF, 256, queued=1000)
        sizes.append(n)
        c.observe(REF, n, 10 + 6.5 * n)
    assert sizes[:3] == [first, 2 * first, 4 * first]  # probes double while they fit
    best = 64 / (10 + 6.5 * 64) * 1000  # 150 items/s: the largest size within 465 ms
    assert c.throughput(REF, 256) >= NEAR_BEST * best
    assert c.predict_ms(REF, c.batch_target(REF, 256)) <= 465


def test_no_probe_without_the_work_to_fill_it() -> None:
    c = CostModel(budget_ms=465)
    c.seed(REF, {1: 10.0, 4: 20.0, 8: 300.0})
    assert c.batch_target(REF, 64) == 4
    assert c.batch_size(REF, 64, queued=5) == 4  # the probe of 8 needs 8 waiting
    assert c.batch_size(REF, 64, queued=8) == 8


def test_a_confirmed_slow_size_is_probed_again_only_now_and_then() -> None:
    c = CostModel(budget_ms=465)
    c.seed(REF, {1: 10.0, 4: 20.0})
    for _ in range(CONFIRMED):
        assert c.batch_size(REF, 64, queued=100) == 8
        c.observe(REF, 8, 200.0)  # really slow at 8
    assert c.batch_target(REF, 64) == 4
    probes = 0
    for _ in range(REPROBE_EVERY):
        n = c.batch_size(REF, 64, queued=100)
        probes += n == 8
        c.observe(REF, n, 20.0 if n == 4 else 200.0)
    assert probes == 1


def test_a_disturbed_spell_does_not_keep_the_batch_small_once_a_probe_sees_it_passed() -> None:
    # The GPU worker's curve: 512 in 7 ms, 1,024 in 12.5 ms (the largest is fastest).
    c = CostModel(budget_ms=465)
    c.seed(REF, {256: 4.0, 512: 7.0, 1024: 12.5})
    assert c.batch_target(REF, 1024) == 1024
    for _ in range(SAMPLES_KEPT):  # a spell of slow readings (three schedulers starting)
        c.observe(REF, 1024, 30.0)
    assert c.batch_target(REF, 1024) == 512
    sizes = []
    for _ in range(2 * CONFIRMED):  # the spell is over: the real curve again
        n = c.batch_size(REF, 1024, queued=5000)
        sizes.append(n)
        c.observe(REF, n, 12.5 if n == 1024 else 7.0)
    # The first take probes 1,024; its reading replaces the spell's, and 1,024 is the
    # target again from the next batch on (not after SAMPLES_KEPT // 2 + 1 probes,
    # REPROBE_EVERY batches apart).
    assert sizes[0] == 1024
    assert c.batch_target(REF, 1024) == 1024 and sizes[1:] == [1024] * (len(sizes) - 1)


def test_a_slower_probe_keeps_the_samples_it_is_outvoted_by() -> None:
    c = CostModel(budget_ms=465)
    c.seed(REF, {1: 10.0, 4: 20.0})
    for _ in range(CONFIRMED):
        c.observe(REF, c.batch_size(REF, 64, queued=100), 200.0)  # 8 is slow
    assert c.batch_target(REF, 64) == 4 and c.measured(REF, 8) == CONFIRMED


def test_a_probe_that_could_not_fit_the_budget_is_not_made() -> None:
    c = CostModel(budget_ms=100)
    c.seed(REF, {1: 10.0, 8: 60.0})
    assert c.batch_target(REF, 64) == 8
    assert c.batch_size(REF, 64, queued=1000) == 8  # 16 would take ~120 ms


def test_budget_from_the_tightest_slo() -> None:
    s = Settings(tier_slo_ms={"enterprise": 1000, "paid": 2000}, max_linger_ms=50)
    assert s.batch_budget() == (1000 - 50 - s.deadline_margin_ms) / 2
    assert Settings(batch_budget_ms=80).batch_budget() == 80
    assert Settings().batch_budget() == DEFAULT_BUDGET_MS


@given(
    st.dictionaries(st.integers(1, 2048), st.floats(0.01, 5000), min_size=1, max_size=12),
    st.integers(1, 2048),
    st.floats(1, 5000),
)
def test_pick_fits_the_budget_and_the_cap(
    profile: dict[int, float], cap: int, budget: float
) -> None:
    c = CostModel(budget_ms=budget)
    c.seed(REF, profile)
    n = c.batch_target(REF, cap)
    assert 1 <= n <= cap
    limit = max(budget, c.predict_ms(REF, 1) / 0.95)
    assert c.predict_ms(REF, n) <= limit or n == 1
    for queued in (0, n, 4 * n, 10_000):
        assert 1 <= c.batch_size(REF, cap, queued) <= max(n, min(cap, queued))


def test_a_model_too_slow_for_the_tightest_slo_sizes_batches_for_the_next() -> None:
    # 642 ms for one item, +58 ms per item: no batch fits enterprise's 465 ms budget;
    # paid's 965 ms holds six (6.4 items/s instead of 1.6 at batches of one).
    curve = {1: 642.0, 10: 1168.0}
    c = CostModel(budget_ms=(465.0, 965.0, 2465.0))
    c.seed(REF, curve)
    assert c.batch_target(REF, 10) == 6
    assert Settings().batch_budgets() == (465.0, 965.0, 2465.0)


def test_saturated_workers_pace_is_measured_with_the_gaps_between_batches() -> None:
    c = CostModel()
    c.seed(REF, {1: 100.0, 10: 100.0})
    assert c.saturated_rate(REF, 2) is None  # nothing measured yet
    # two workers, batches of 10 every 102 ms each (2 ms between batches): 196 items/s
    for i in range(80):
        c.took(REF, 10, now=i * 0.051, left=500)
    assert c.saturated_rate(REF, 2) == pytest.approx(10 / 0.051, rel=0.01)
    assert c.saturated_rate(REF, 3) is None  # another worker count: measured again
    c.took(REF, 10, now=5.0, left=3)  # the queue ran short: the stretch ends
    assert c.saturated_rate(REF, 3) is None


def test_capacity_reports_what_saturated_workers_delivered_when_it_is_less() -> None:
    from scheduler.core.capacity import capacity_by_model

    c = CostModel()
    c.seed(REF, {1: 100.0, 10: 100.0})
    c.saturated_rate(REF, 2)  # the report notes the worker count
    for i in range(80):
        c.took(REF, 10, now=i * 0.051, left=500)
    cap = capacity_by_model(c, [{REF}, {REF}], {REF: 10})["m@1"]
    assert cap["items_s"] == pytest.approx(196, rel=0.01) and cap["batch_ms"] == 100.0


def test_a_warm_up_reading_above_a_larger_measured_size_is_capped() -> None:
    # The first call of a process is slow: 227 ms for one item, while batches of 8 are
    # measured at 50 ms. Batches of one may never run to correct it.
    c = CostModel()
    c.seed(REF, {1: 227.0, 8: 300.0, 64: 900.0})
    for _ in range(3):
        c.observe(REF, 8, 50.0)
    assert c.predict_ms(REF, 1) == 50.0 and c.predict_ms(REF, 8) == 50.0
    assert c.predict_ms(REF, 64) == 900.0  # larger sizes keep their own reading
