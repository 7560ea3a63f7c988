"""Pure pieces of the GPU path, on CPU: token-id transport, sub-batch plan, memory bound."""

from __future__ import annotations

import random

import numpy as np
import orjson
import pytest

from core.models.token_ids import (
    decode_batch,
    decode_ids,
    encode_ids,
    input_text,
    is_tokenized,
    tokenized_input,
)
from results.store import _json
from workers.models.base import memory_batch_limit
from workers.models.subbatch import fit_ms, plan


def test_ids_round_trip_through_json() -> None:
    ids = [101, 0, 9, 31, 127, 128, 2047, 2048, 30521, 102]
    msg = tokenized_input("hello", ids)
    back = orjson.loads(orjson.dumps(msg))
    assert is_tokenized(back) and decode_ids(back["ids"]) == ids
    assert input_text(back) == "hello" and input_text("plain") == "plain"
    assert not is_tokenized({"text": "x"}) and not is_tokenized("x")
    with pytest.raises(ValueError):
        encode_ids([0xD800])


def test_decode_batch_packs_end_to_end() -> None:
    seqs = [[101, 7, 102], [101, 102], [], [101, 30000, 5, 102]]
    flat, lens, starts = decode_batch([encode_ids(s) for s in seqs])
    assert flat.dtype == np.int32 and lens.tolist() == [3, 2, 0, 4]
    assert starts.tolist() == [0, 3, 5, 5]
    assert flat.tolist() == [x for s in seqs for x in s]


def _seq_pad(n: int) -> int:
    return -(-n // 16) * 16


def _graph_rows(s: int) -> list[int]:
    cap = max(1, min(32_768 // s, 1024))
    return sorted({*(1 << i for i in range(cap.bit_length()) if (1 << i) < cap), cap})


def _greedy(lens: list[int]) -> float:
    """The old cut: as many rows as fit the bucket, rounded up to a captured graph."""
    total, a = 0.0, 0
    while a < len(lens):
        b = a + 1
        while b < len(lens) and b + 1 - a <= _graph_rows(_seq_pad(lens[b]))[-1]:
            b += 1
        s = _seq_pad(lens[b - 1])
        total += fit_ms(next(g for g in _graph_rows(s) if g >= b - a), s)
        a = b
    return total


@pytest.mark.parametrize("step", [1, 8, 16])
def test_plan_covers_the_batch_within_captured_shapes(step: int) -> None:
    rnd = random.Random(step)
    for n in (1, 2, 7, 100, 1024):
        lens = sorted(rnd.randint(3, 256) for _ in range(n))
        parts = plan(lens, _seq_pad, _graph_rows, fit_ms, step)
        assert parts[0][0] == 0 and parts[-1][1] == n
        for (a, b, g, s), nxt in zip(parts, [*parts[1:], None], strict=True):
            assert b > a and (nxt is None or nxt[0] == b)
            assert s == _seq_pad(lens[b - 1]) and g in _graph_rows(s) and g >= b - a


def test_plan_beats_the_greedy_cut_on_a_mixed_batch() -> None:
    rnd = random.Random(0)
    lens = sorted(rnd.randint(8, 128) for _ in range(1024))
    # Every cut allowed: the plan is the cheapest split, so never worse than greedy.
    parts = plan(lens, _seq_pad, _graph_rows, fit_ms, 1)
    cost = sum(fit_ms(g, s) for _, _, g, s in parts)
    assert cost <= _greedy(lens)
    coarse = plan(lens, _seq_pad, _graph_rows, fit_ms, 16)  # what the worker runs
    assert sum(fit_ms(g, s) for _, _, g, s in coarse) <= 1.02 * cost
    padded = sum(g * s for _, _, g, s in parts)
    assert padded / sum(lens) - 1 < 0.3


def test_plan_follows_measured_costs() -> None:
    """A shape that measured slow is avoided when another cut can do the work."""
    lens = [16] * 64
    parts = plan(lens, _seq_pad, _graph_rows, lambda g, s: 99.0 if g == 64 else float(g), 1)
    assert all(g != 64 for _, _, g, _ in parts)
    assert plan([], _seq_pad, _graph_rows, fit_ms) == []
    with pytest.raises(ValueError):
        plan([40, 3], _seq_pad, _graph_rows, fit_ms)


def test_memory_bound_on_the_batch_size() -> None:
    mib = 2**20
    peaks = {1: 600 * mib, 64: 700 * mib, 128: 900 * mib, 1024: 900 * mib}
    # 562 MiB of captured graphs are already held (and no longer free).
    assert memory_batch_limit(peaks, 562 * mib, 10_000 * mib, 1024) == 1024
    assert memory_batch_limit(peaks, 562 * mib, 200 * mib, 1024) == 64
    assert memory_batch_limit(peaks, 562 * mib, 10 * mib, 1024) == 1
    assert memory_batch_limit({}, 0, 0, 256) == 256


def test_array_rows_are_stored_as_the_same_json_as_lists() -> None:
    rows = np.random.default_rng(1).standard_normal((50, 384)).astype(np.float32)
    for r in rows:
        assert _json(r) == orjson.dumps(r.tolist()).decode()
    assert _json({"a": 1}) == '{"a":1}'
