"""Shedding by the API's own saturation (ingest/admission/overload.py): event-loop lag and the
delay of its answers. Pure rules, plus the monitor measuring a loop that is
really held up."""

from __future__ import annotations

import asyncio
import itertools
import math
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.config import Settings
from ingest.admission.overload import AnswerDelay, LoopLag, Overload, shed_share

TIERS = Settings().loop_lag_shed_ms
PATH = Settings().answer_delay_shed_ms


def test_no_shedding_below_the_lower_threshold() -> None:
    assert shed_share(10, 20, 80) == 0.0


def test_everything_shed_from_the_upper_threshold() -> None:
    assert shed_share(80, 20, 80) == 1.0 and shed_share(500, 20, 80) == 1.0


def test_ramp_between() -> None:
    assert shed_share(50, 20, 80) == pytest.approx(0.5)


@given(st.floats(0, 1000), st.floats(0, 1000))
def test_share_is_monotone_in_lag(a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert shed_share(lo, 20, 80) <= shed_share(hi, 20, 80)


def test_lowest_tier_is_shed_first() -> None:
    o = Overload()
    o.lag.lag_ms = 60.0  # past free's lower threshold only
    assert o.should_shed("free", TIERS, PATH, draw=0.05)
    assert not o.should_shed("paid", TIERS, PATH, draw=0.0001)
    assert not o.should_shed("enterprise", TIERS, PATH, draw=0.0001)
    o.lag.lag_ms = 1000.0
    assert all(o.should_shed(t, TIERS, PATH, draw=0.9999) for t in ("free", "paid", "enterprise"))


def test_a_lower_tier_gets_nothing_while_a_higher_one_is_refused() -> None:
    o = Overload()
    o.lag.lag_ms = 80.0  # past paid's lower threshold (75): paid partly shed
    assert 0 < o.share("paid", TIERS, PATH) < 1
    assert o.share("free", TIERS, PATH) == 1.0  # its own ramp would say 0.3
    assert o.share("enterprise", TIERS, PATH) == 0.0


@given(st.floats(0, 400), st.floats(0, 400))
def test_shares_never_fall_with_the_tier(lag: float, answer: float) -> None:
    o = Overload()
    o.lag.lag_ms = lag
    o.answer._ms, o.answer._at = answer, time.monotonic()
    shares = [o.share(t, TIERS, PATH) for t in ("enterprise", "paid", "free")]
    assert shares == sorted(shares)
    for higher, lower in itertools.pairwise(shares):
        assert higher == 0 or lower == 1


def test_unknown_tier_uses_the_strictest_thresholds() -> None:
    o = Overload()
    o.lag.lag_ms = 60.0
    assert o.should_shed("trial", TIERS, PATH, draw=0.05)


def test_slow_answers_shed_even_with_a_prompt_loop() -> None:
    o = Overload()
    for _ in range(500):
        o.answer.observe(400.0)  # answers leave 400 ms after their result is stored
    assert o.lag.lag_ms == 0.0
    assert o.should_shed("enterprise", TIERS, PATH, draw=0.9999)


def test_answer_delay_decays_when_nothing_is_answered() -> None:
    p = AnswerDelay(alpha=1.0, tau_s=1.0, cap_ms=1e9)
    p.observe(300.0, now=10.0)
    assert p.ms(now=10.0) == pytest.approx(300.0)
    assert p.ms(now=13.0) == pytest.approx(300.0 * math.exp(-3))
    # Shedding everything cannot keep itself going: the reading falls below any threshold.
    assert p.ms(now=20.0) < min(lo for lo, _ in PATH.values())


def test_stragglers_cannot_hold_the_guard_shut() -> None:
    """Stragglers (found seconds late by the slow poll) are capped: shedding ends soon."""
    p = AnswerDelay()
    for _ in range(200):
        p.observe(5000.0, now=100.0)
    assert p.ms(now=100.0) <= p.cap_ms
    assert p.ms(now=102.0) < min(lo for lo, _ in PATH.values())


def test_answer_delay_smooths_observations() -> None:
    p = AnswerDelay(alpha=0.5, tau_s=1e9)
    p.observe(100.0, now=1.0)
    p.observe(0.0, now=1.0)
    assert p.ms(now=1.0) == pytest.approx(25.0)
    assert AnswerDelay().ms() == 0.0


def test_smoothing_follows_the_loop() -> None:
    lag = LoopLag(alpha=0.5)
    lag.observe(0.100)
    assert lag.lag_ms == pytest.approx(50.0)
    lag.observe(-0.01)  # early timers count as on time
    assert lag.lag_ms == pytest.approx(25.0)


def test_monitor_sees_a_blocked_loop() -> None:
    async def scenario() -> list[float]:
        lag = LoopLag(period_s=0.01)
        seen: list[float] = []
        observe = lag.observe
        lag.observe = lambda late_s: (seen.append(late_s), observe(late_s))[1]  # type: ignore[method-assign]
        task = asyncio.create_task(lag.run())
        await asyncio.sleep(0.05)
        assert seen and max(seen) < 0.05
        time.sleep(0.15)  # hold the loop, as a saturated API process does
        await asyncio.sleep(0.03)
        task.cancel()
        assert lag.lag_ms > 5  # smoothed, and still up shortly after the late timer
        return seen

    assert max(asyncio.run(scenario())) > 0.1
