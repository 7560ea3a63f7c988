"""scheduler/core/generation/events.py: an answer's inter-token latency as the request
log keeps it."""

from __future__ import annotations

from scheduler.core.generation.events import gap_summary


def test_no_gap_with_fewer_than_two_tokens() -> None:
    assert gap_summary(()) is None


def test_median_p95_and_longest_in_ms_by_nearest_rank() -> None:
    gaps = [0.010] * 18 + [0.030, 0.500]  # 20 gaps: one preemption's pause at the end
    assert gap_summary(gaps) == {"p50": 10.0, "p95": 30.0, "max": 500.0}
    assert gap_summary(reversed(gaps)) == gap_summary(gaps)  # order does not matter
    assert gap_summary([0.0123456]) == {"p50": 12.346, "p95": 12.346, "max": 12.346}
    odd = gap_summary([0.001, 0.002, 0.003])
    assert odd is not None and odd["p50"] == 2.0 and odd["max"] == 3.0
