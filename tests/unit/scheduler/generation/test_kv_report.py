"""What the generation policy publishes for KV admission: the pool, blocks in use,
blocks wanted per class, and the decode rate over a window of stepping time."""

from __future__ import annotations

import pytest

from scheduler.core.generation.kv_report import DecodeRate, kv_state
from tests.unit.scheduler.generation.fake_model import FakeRunner
from tests.unit.scheduler.generation.helpers import batcher, req


def test_a_fresh_pool_reports_its_shape_and_nothing_used_or_wanted() -> None:
    b = batcher(num_blocks=40, block_size=8, max_model_len=64)
    s = kv_state(b, 0.0)
    assert (s["num_blocks"], s["block_size"], s["used"]) == (40, 8, 0)
    assert s["wanted"] == {"enterprise": 0, "paid": 0, "free": 0, "jobs": 0}


def test_waiting_sequences_want_their_worst_case_blocks_in_their_class() -> None:
    b = batcher(num_blocks=40, block_size=4, max_model_len=64)
    b.add(req(5, 10, rank=2))  # 15 tokens: 4 blocks
    b.add(req(4, 4, rank=2))  # 8 tokens: 2 blocks
    b.add(req(3, 100, rank=0))  # capped at the context (64 tokens): 16 blocks
    s = kv_state(b, 12.5)
    assert s["wanted"] == {"enterprise": 16, "paid": 0, "free": 6, "jobs": 0}
    assert s["decode_tok_s"] == 12.5


def test_running_sequences_hold_blocks_and_want_none() -> None:
    b = batcher(num_blocks=40, block_size=4, max_model_len=64)
    r = req(6, 10, rank=1)
    b.add(r)
    plan = b.schedule(0.0)
    b.update(plan, FakeRunner(40, 4).execute(plan), 0.0)
    s = kv_state(b, 0.0)
    assert s["used"] == 2  # 6 prompt tokens in blocks of 4
    assert s["wanted"]["paid"] == 0


def test_a_preempted_sequence_wants_its_blocks_again() -> None:
    b = batcher(num_blocks=40, block_size=4, max_model_len=64)
    r = req(6, 10, rank=3)
    b.add(r)
    plan = b.schedule(0.0)
    b.update(plan, FakeRunner(40, 4).execute(plan), 0.0)
    assert kv_state(b, 0.0)["used"] == 2
    b.drop_cache(0.0)  # the worker lost its pool: the sequence recomputes later
    s = kv_state(b, 0.0)
    assert s["used"] == 0
    assert s["wanted"]["jobs"] == 4  # 16 tokens


def test_decode_rate_counts_stepping_time_not_idle_time() -> None:
    r = DecodeRate(window_s=5.0)
    for i in range(10):  # 10 steps of 20 ms, 8 tokens each, one every 100 ms
        r.add(i * 0.1, 0.02, 8)
    assert r.rate(1.0) == pytest.approx(80 / 0.2)
    # Idle for a minute: nothing in the window, the last rate stands.
    assert r.rate(60.0) == pytest.approx(400.0)


def test_decode_rate_follows_a_slower_batch_within_the_window() -> None:
    r = DecodeRate(window_s=2.0)
    for i in range(20):
        r.add(i * 0.1, 0.01, 10)  # 1000 tokens/s
    for i in range(40):
        r.add(2.0 + i * 0.1, 0.05, 10)  # 200 tokens/s
    assert r.rate(6.0) == pytest.approx(200.0)


def test_no_step_yet_is_a_zero_rate() -> None:
    assert DecodeRate().rate(0.0) == 0.0
