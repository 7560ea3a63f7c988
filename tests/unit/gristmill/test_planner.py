"""The capacity planner's arithmetic."""

from __future__ import annotations

import math

import pytest

from gristmill.planner import interpolate, plan, render

FLAT = {1: 100.0, 100: 100.0}  # sim: 100 ms whatever the batch


def test_flat_cost_picks_the_full_batch() -> None:
    p = plan(rate=1000, slo_ms=500, profile=FLAT, max_batch=100)
    assert p.chosen is not None and p.chosen.batch == 100
    assert p.chosen.throughput == pytest.approx(1000)
    assert p.workers == 2  # 1000 / (0.75 * 1000) -> 1.33 -> 2


def test_slo_limits_the_batch_size_on_a_linear_curve() -> None:
    gpu = {1: 2.0, 64: 4.0, 256: 16.0, 1024: 64.0}
    p = plan(rate=50_000, slo_ms=100, profile=gpu, max_batch=1024, linger_ms=10, overhead_ms=10)
    # W(b) = 2 t(b) + 20 <= 100  =>  t(b) <= 40 ms  =>  b well below 1024
    assert p.chosen is not None and p.chosen.compute_ms <= 40
    assert all(not o.fits for o in p.options if o.compute_ms > 40)
    assert p.workers == math.ceil(50_000 / (0.75 * p.chosen.throughput))


def test_impossible_slo_says_so() -> None:
    p = plan(rate=10, slo_ms=100, profile=FLAT, max_batch=100)
    assert p.chosen is None and p.workers is None
    assert "No batch size meets the SLO" in render(p, "sim")


def test_interpolation() -> None:
    prof = {1: 10.0, 11: 20.0}
    assert interpolate(prof, 6) == pytest.approx(15.0)
    assert interpolate(prof, 22) == pytest.approx(40.0)  # linear past the last point
    assert interpolate(prof, 1) == 10.0


def test_render_shows_the_formula() -> None:
    out = render(plan(rate=1000, slo_ms=500, profile=FLAT, max_batch=100), "sim")
    assert "N = ceil(rate / (utilization x X(b)))" in out and "2 worker(s)" in out
