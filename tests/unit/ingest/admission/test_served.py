"""What the jobs class was served, from backlog reads (ingest/admission/served.py)."""

from __future__ import annotations

import pytest

from ingest.admission.served import MIN_WINDOW_S, ServedHistory, blended_rate


def _history(samples: list[tuple[float, dict[str, float]]], capacity: float = 1e9) -> ServedHistory:
    h = ServedHistory()
    for t, left in samples:
        h.record(t, left, capacity)
    return h


def test_items_the_backlog_lost_between_reads_were_served() -> None:
    # Two jobs draining at 30/s and 10/s over 20 s.
    h = _history([(t, {"a": 1000 - 30 * t, "b": 500 - 10 * t}) for t in range(0, 21, 2)])
    assert h.rate(60.0) == pytest.approx((40.0, 20.0))


def test_the_rate_is_over_the_last_horizon_only() -> None:
    # 100/s for 30 s, then 20/s for 10 s: over the last 10 s, 20/s.
    left = [(float(t), {"a": 10_000 - 100 * t}) for t in range(0, 31)]
    left += [(30.0 + t, {"a": 7_000 - 20 * t}) for t in range(1, 11)]
    h = _history(left)
    assert h.rate(10.0) == pytest.approx((20.0, 10.0))
    assert h.rate(40.0) == pytest.approx((3_200 / 40, 40.0))


def test_a_new_job_is_not_counted_as_served_and_takes_nothing_away() -> None:
    h = _history([(0.0, {"a": 1000}), (5.0, {"a": 900, "b": 5000}), (10.0, {"a": 800, "b": 4900})])
    assert h.rate(10.0) == pytest.approx((300 / 10, 10.0))


def test_a_job_that_vanished_counts_at_most_what_the_workers_could_serve() -> None:
    # "a" finished with 40 left at 50/s capacity over 2 s: all 40 served.
    h = _history([(0.0, {"a": 40, "b": 9000}), (2.0, {"b": 8950}), (6.0, {"b": 8750})], 50.0)
    assert h.rate(6.0) == pytest.approx(((40 + 50 + 200) / 6, 6.0))
    # A cancelled job of 100,000 items: not 100,000 served in a second.
    h = _history([(0.0, {"a": 100_000, "b": 9000}), (1.0, {"b": 8950}), (6.0, {"b": 8700})], 80.0)
    assert h.rate(6.0) == pytest.approx(((80 + 50 + 250) / 6, 6.0))


def test_an_empty_backlog_forgets_what_came_before() -> None:
    h = _history([(0.0, {"a": 1000}), (10.0, {"a": 0}), (20.0, {"b": 500}), (22.0, {"b": 480})])
    assert h.rate(60.0) is None  # 2 s since the class was backlogged again: no rate yet
    h.record(30.0, {"b": 400}, 1e9)
    assert h.rate(60.0) == pytest.approx((10.0, 10.0))


def test_reads_closer_than_a_second_are_one_sample_and_short_windows_no_rate() -> None:
    h = _history([(0.0, {"a": 1000}), (0.3, {"a": 990}), (0.6, {"a": 980})])
    assert h.rate(60.0) is None
    h.record(MIN_WINDOW_S - 1.5, {"a": 900}, 1e9)
    assert h.rate(60.0) is None
    h.record(MIN_WINDOW_S, {"a": 890}, 1e9)
    assert h.rate(60.0) == pytest.approx((110 / MIN_WINDOW_S, MIN_WINDOW_S))


def test_old_samples_go() -> None:
    h = _history([(float(t), {"a": 1e6 - t}) for t in range(0, 4000, 10)])
    assert h.rate(10_000.0) == pytest.approx((1.0, 3600.0))


def test_what_was_observed_stands_for_the_part_of_the_horizon_it_covers() -> None:
    assert blended_rate(100.0, None, 60.0) == 100.0
    assert blended_rate(100.0, (60.0, 120.0), 60.0) == pytest.approx(60.0)  # covers it all
    assert blended_rate(100.0, (60.0, 15.0), 60.0) == pytest.approx(0.25 * 60 + 0.75 * 100)
    assert blended_rate(100.0, (60.0, 30.0), 0.0) == 100.0  # now: the prediction
    assert blended_rate(0.0, (60.0, 60.0), 60.0) == 0.0  # no workers: no quote
