"""Online compute prediction and the failure plan for poison inputs."""

from __future__ import annotations

import random

import pytest

from scheduler.costmodel import CostModel
from scheduler.retry import RetryPolicy, plan_failure
from tests.unit.helpers import pending

REF = ("m", "1")


def test_unknown_model_uses_default() -> None:
    assert CostModel(default_ms=42).predict_ms(REF, 8) == 42


def test_seeded_profile_interpolates_and_clamps() -> None:
    c = CostModel()
    c.seed(REF, {1: 10.0, 100: 110.0})
    assert c.predict_ms(REF, 1) == 10.0
    assert c.predict_ms(REF, 50) == pytest.approx(10 + 49 / 99 * 100)
    assert c.predict_ms(REF, 500) == 110.0


def test_observations_move_the_estimate() -> None:
    c = CostModel(alpha=0.5)
    c.seed(REF, {8: 100.0})
    c.observe(REF, 8, 200.0)
    assert c.predict_ms(REF, 8) == pytest.approx(150.0)
    c.seed(REF, {8: 1.0})  # a later seed does not overwrite what was measured
    assert c.predict_ms(REF, 8) == pytest.approx(150.0)


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
