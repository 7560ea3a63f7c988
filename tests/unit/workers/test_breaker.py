"""The HTTP backend's circuit breaker (workers/models/breaker.py), on a hand-fed clock."""

from __future__ import annotations

from workers.models.breaker import Breaker, Circuit


def test_it_opens_after_failures_in_a_row_only() -> None:
    b = Breaker(failures=3, open_s=5)
    assert not b.failure(0) and not b.failure(1)
    b.success(2)  # a success resets the streak
    assert not b.failure(3) and not b.failure(4)
    assert b.failure(5) and b.state(5) is Circuit.OPEN and b.opened == 1
    assert not b.allows_calls(5) and b.retry_after(6) == 4


def test_after_its_time_one_probe_goes_and_success_closes_it() -> None:
    b = Breaker(failures=1, open_s=5)
    b.failure(0)
    assert not b.start_probe(4.9)
    assert b.state(5) is Circuit.HALF_OPEN and not b.allows_calls(5)
    assert b.start_probe(5) and not b.start_probe(5.1)  # exactly one probe out
    assert b.success(5.2) and b.state(5.2) is Circuit.CLOSED and b.allows_calls(5.2)


def test_a_failed_probe_opens_it_for_another_period() -> None:
    b = Breaker(failures=1, open_s=5)
    b.failure(0)
    assert b.start_probe(6)
    assert not b.failure(6)  # not a new opening
    assert b.state(7) is Circuit.OPEN and b.retry_after(7) == 4 and b.opened == 1
