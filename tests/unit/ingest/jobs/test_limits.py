"""The job-item budget and the slots for uploads and streams (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import RateLimited, Unavailable
from ingest.admission.shared_slots import SharedSlots
from ingest.jobs.limits import acquire
from ingest.jobs.quota import BURST_S, decide
from results.job_quota import Budget


def test_a_new_tenant_has_a_full_bucket_and_may_go_into_debt_once() -> None:
    rate = 100.0
    v, left = decide(Budget(None, 0.0), rate, 10_000)  # bigger than the 6,000 burst
    assert v.allowed and left == rate * BURST_S - 10_000
    v2, left2 = decide(Budget(left, 1.0), rate, 1)  # 1 s later: still 3,900 in debt
    assert not v2.allowed and left2 == left + rate
    assert v2.retry_after_s == pytest.approx(-left2 / rate)


def test_the_debt_is_waited_off() -> None:
    v, _ = decide(Budget(-500.0, 5.01), 100.0, 50)
    assert v.allowed


def test_a_zero_item_look_only_refuses_while_in_debt() -> None:
    assert decide(Budget(0.0, 0.0), 100.0, 0)[0].allowed
    assert not decide(Budget(-1.0, 0.0), 100.0, 0)[0].allowed


def test_refill_is_capped_at_the_burst() -> None:
    _, left = decide(Budget(0.0, 10_000.0), 100.0, 0)
    assert left == 100.0 * BURST_S


def test_refused_slots_are_429_for_the_tenant_and_503_for_the_instance(tmp_path: Path) -> None:
    slots = SharedSlots(tmp_path, "uploads", total=2, per_key=1)
    acquire(slots, "a", "uploads")
    with pytest.raises(RateLimited) as e:
        acquire(slots, "a", "uploads")
    assert e.value.retry_after_s and e.value.status == 429
    acquire(slots, "b", "uploads")
    with pytest.raises(Unavailable) as e2:
        acquire(slots, "c", "uploads")
    assert e2.value.retry_after_s and e2.value.status == 503
