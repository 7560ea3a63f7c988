"""ingest/jobs/pacing.py: a job's intake pauses while the event loop lags, and only then."""

from __future__ import annotations

import pytest

from core.config import Settings
from ingest.jobs.pacing import MAX_PAUSE_S, Pacer, pause_s, target_lag_ms


def test_the_target_is_half_the_lowest_shed_start() -> None:
    assert target_lag_ms(Settings().loop_lag_shed_ms) == 25.0  # free starts at 50 ms
    assert target_lag_ms({"free": (10.0, 20.0), "paid": (30.0, 40.0)}) == 5.0


def test_no_pause_while_the_loop_keeps_up() -> None:
    assert pause_s(0.0, 25.0, 0.05) == 0.0
    assert pause_s(25.0, 25.0, 0.05) == 0.0


def test_the_pause_grows_with_the_lag_and_is_capped() -> None:
    assert pause_s(50.0, 25.0, 0.05) == pytest.approx(0.1)  # twice the target: twice the slice
    assert pause_s(100.0, 25.0, 0.05) == pytest.approx(0.2)
    assert pause_s(10_000.0, 25.0, 0.05) == MAX_PAUSE_S  # never stops the intake


def test_the_pacer_reads_the_lag_each_time_and_counts_its_pauses() -> None:
    lag = [0.0]
    p = Pacer(lambda: lag[0], 25.0)
    assert p.after(0.05) == 0.0
    lag[0] = 75.0
    assert p.after(0.05) == pytest.approx(0.15)
    assert p.paused_s == pytest.approx(0.15)
