"""Staggered starts of background batches (scheduler/core/stagger.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core.stagger import Running, background_hold_until


def test_single_worker_never_holds() -> None:
    assert background_hold_until(5.0, [], 1) == 5.0


def test_starts_together_are_spread_by_batch_time_over_workers() -> None:
    # The other worker started a 100 ms batch 10 ms ago: start 50 ms after it.
    assert background_hold_until(1.01, [Running(1.0, 0.1)], 2) == pytest.approx(1.05)


def test_no_hold_once_spread() -> None:
    assert background_hold_until(1.06, [Running(1.0, 0.1)], 2) == 1.06


def test_four_workers_hold_for_the_latest_close_start() -> None:
    others = [Running(0.90, 0.1), Running(0.99, 0.1), Running(0.995, 0.1)]
    assert background_hold_until(1.0, others, 4) == pytest.approx(0.995 + 0.025)


def test_idle_peers_do_not_hold() -> None:
    assert background_hold_until(1.0, [], 3) == 1.0


@given(
    now=st.floats(0, 100),
    starts=st.lists(st.tuples(st.floats(-1, 0), st.floats(0.001, 1)), max_size=8),
    n=st.integers(1, 16),
)
def test_hold_is_bounded_by_one_gap(now: float, starts: list[tuple[float, float]], n: int) -> None:
    others = [Running(now + d, p) for d, p in starts]
    hold = background_hold_until(now, others, n)
    assert hold >= now
    assert hold - now <= max((p / max(n, 1) for _, p in starts), default=0) + 1e-9
    # after the hold, no other batch started less than its gap ago
    if n >= 2:
        assert all(hold - r.started_at >= r.predicted_s / n - 1e-9 for r in others)
