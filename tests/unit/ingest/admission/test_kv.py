"""Completions admitted from the published KV cache: never-fits, the wait for blocks
against the first-token deadline, lowest tier shed first, Retry-After from the
free-block rate. Pool shapes and rates below are arbitrary, not the served model's."""

from __future__ import annotations

import math

import pytest

from core.load_report import KVState, LoadReport
from ingest.admission.kv import MIN_RETRY_S, decide_kv
from ingest.admission.view import LoadView


def state(blocks: int, size: int, used: int, rate: float, **wanted: int) -> KVState:
    return KVState(
        num_blocks=blocks,
        block_size=size,
        used=used,
        wanted={c: wanted.get(c, 0) for c in ("enterprise", "paid", "free", "jobs")},
        decode_tok_s=rate,
    )


def test_no_report_admits() -> None:
    d = decide_kv([], "free", 10_000, 10_000, now=0.0, deadline=0.001)
    assert d.admit and not d.never_fits


@pytest.mark.parametrize(
    ("blocks", "size", "prompt", "max_tokens", "fits"),
    [
        (32, 16, 100, 412, True),  # exactly the pool
        (32, 16, 100, 413, False),  # one token over: a 33rd block
        (7, 32, 1, 224, False),
        (7, 32, 1, 223, True),
        (1000, 1, 500, 500, True),
    ],
)
def test_a_request_beyond_the_whole_pool_never_fits(
    blocks: int, size: int, prompt: int, max_tokens: int, fits: bool
) -> None:
    # An idle pool: only the pool's size can refuse.
    d = decide_kv(
        [state(blocks, size, 0, 100.0)], "enterprise", prompt, max_tokens, now=0.0, deadline=10.0
    )
    assert d.never_fits is not fits
    assert d.admit is fits
    if not fits:
        assert "max_tokens" in d.message and str(blocks * size) in d.message


def test_never_fits_is_judged_against_the_largest_pool() -> None:
    small, large = state(8, 16, 0, 10.0), state(40, 16, 0, 10.0)
    d = decide_kv([small, large], "paid", 200, 300, now=0.0, deadline=10.0)
    assert not d.never_fits


def test_free_blocks_enough_admits_without_a_wait() -> None:
    d = decide_kv([state(50, 8, 30, 0.0, free=5)], "free", 40, 40, now=0.0, deadline=1.0)
    # 20 free; 5 wanted + 10 its own: fits now, whatever the (unmeasured) rate.
    assert d.admit and d.wait_s == 0.0


@pytest.mark.parametrize(
    ("blocks", "size", "used", "rate", "wanted", "need_tokens", "deadline"),
    [
        (64, 16, 64, 480.0, 20, 160, 1.0),  # 30 short at 30 blocks/s: 1 s
        (300, 4, 280, 90.0, 50, 40, 2.5),  # 40 short at 22.5 blocks/s: 1.78 s
        (20, 32, 18, 12.0, 3, 64, 10.0),  # 3 short at 0.375 blocks/s: 8 s
    ],
)
def test_wait_is_the_shortfall_over_the_free_block_rate(
    blocks: int,
    size: int,
    used: int,
    rate: float,
    wanted: int,
    need_tokens: int,
    deadline: float,
) -> None:
    s = state(blocks, size, used, rate, paid=wanted)
    need = math.ceil(need_tokens / size)
    expect = (wanted + need - (blocks - used)) / (rate / size)
    d = decide_kv(
        [s],
        "paid",
        need_tokens // 2,
        need_tokens - need_tokens // 2,
        now=100.0,
        deadline=100.0 + deadline,
    )
    assert d.wait_s == pytest.approx(expect)
    assert d.admit is (expect <= deadline)
    # Just past the deadline: refused, Retry-After the excess wait (at least 1 s).
    late = decide_kv(
        [s],
        "paid",
        need_tokens // 2,
        need_tokens - need_tokens // 2,
        now=100.0,
        deadline=100.0 + expect * 0.5,
    )
    assert not late.admit and not late.never_fits
    assert late.retry_after_s == pytest.approx(max(MIN_RETRY_S, expect * 0.5))


def test_the_lowest_tier_is_shed_first_under_a_saturated_pool() -> None:
    # Full pool, 10 blocks/s freed; waiting: 5 enterprise, 10 paid, 30 free, 100 jobs.
    s = state(100, 10, 100, 100.0, enterprise=5, paid=10, free=30, jobs=100)
    got = {
        c: decide_kv([s], c, 20, 30, now=0.0, deadline=3.0)  # 5 blocks its own
        for c in ("enterprise", "paid", "free", "jobs")
    }
    assert got["enterprise"].wait_s == pytest.approx(1.0)
    assert got["paid"].wait_s == pytest.approx(2.0)
    assert got["free"].wait_s == pytest.approx(5.0)
    assert got["jobs"].wait_s == pytest.approx(15.0)
    assert [got[c].admit for c in got] == [True, True, False, False]
    assert got["jobs"].retry_after_s > got["free"].retry_after_s
    assert "free" in got["free"].message


def test_demand_below_the_class_does_not_count() -> None:
    s = state(100, 10, 100, 100.0, jobs=10_000)
    assert decide_kv([s], "paid", 20, 30, now=0.0, deadline=1.0).admit


def test_no_measured_rate_admits_rather_than_guess() -> None:
    s = state(100, 10, 100, 0.0, free=500)
    assert decide_kv([s], "free", 20, 30, now=0.0, deadline=0.5).admit


def test_a_deadline_already_past_still_quotes_the_whole_wait() -> None:
    s = state(10, 10, 10, 20.0)  # 2 blocks/s
    d = decide_kv([s], "paid", 10, 10, now=5.0, deadline=4.0)  # 2 blocks short: 1 s
    assert not d.admit and d.retry_after_s == pytest.approx(1.0)


def test_several_schedulers_pools_and_rates_add_up() -> None:
    a = state(50, 16, 50, 160.0, free=10)  # 10 blocks/s
    b = state(50, 16, 40, 160.0, free=0)  # 10 free, 10 blocks/s
    # 10 wanted - 10 free + its 4 blocks (2 per scheduler, each taking half): 4 at 20/s.
    d = decide_kv([a, b], "free", 32, 32, now=0.0, deadline=1.0)
    assert d.admit and d.wait_s == pytest.approx(0.2)


def test_the_load_view_keeps_each_schedulers_cache() -> None:
    a, b = state(50, 16, 1, 1.0), state(60, 16, 2, 2.0)
    view = LoadView.combine(
        [LoadReport(kv={"gristmill-lm@1": a}), LoadReport(kv={"gristmill-lm@1": b}), LoadReport()]
    )
    assert view.kv == {"gristmill-lm@1": [a, b]}
