"""The whole-system generation scenario's pieces that need no services: its statistics,
its reading of server-sent events, its prompts, and static batching as a scheduler
gets it (bench/gpuhost/genstats.py, genload.py, generation.py, bench/generation/static.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.generation.static import ServedStaticBatcher
from bench.gpuhost.genload import CONTEXT, Event, Mix, SseParser, apply
from bench.gpuhost.genstats import Streamed, errors_by_kind, percentile, ratios, summarize
from scheduler.core.generation.config import PolicyConfig
from scheduler.core.generation.sequence import GenRequest

REPO = Path(__file__).resolve().parents[3]


def test_percentile_interpolates_like_numpy() -> None:
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(xs, 0.5) == 3.0
    assert percentile(xs, 0.95) == pytest.approx(4.8)
    assert percentile(xs, 0.0) == 1.0 and percentile(xs, 1.0) == 5.0
    assert percentile([7.0], 0.95) == 7.0
    assert percentile([], 0.5) is None


def test_chunks_give_first_token_gaps_and_the_window() -> None:
    r = Streamed(sent=10.0, max_tokens=8, prompt_tokens=20)
    for at in (10.5, 10.6, 10.8, 11.5):
        r.chunk(at, window_end=11.0)
    assert r.first == 10.5 and r.last == 11.5
    assert r.gaps == pytest.approx([0.1, 0.2, 0.7])
    assert r.chunks == 4 and r.in_window == 3
    assert r.tokens == 4  # no usage: the chunks
    r.usage_tokens = 5
    assert r.tokens == 5


def _done(sent: float, firsts: list[float], max_tokens: int = 10) -> Streamed:
    r = Streamed(sent=sent, max_tokens=max_tokens, prompt_tokens=30, status=200)
    for t in firsts:
        r.chunk(t, window_end=100.0)
    r.finish_reason, r.done = "length", firsts[-1]
    return r


def test_summarize_counts_what_finished_and_what_did_not() -> None:
    records = [
        _done(0.0, [0.1, 0.2, 0.3]),
        _done(1.0, [1.3, 1.4]),
        Streamed(sent=2.0, max_tokens=10, prompt_tokens=10, status=429, error="http 429"),
        Streamed(sent=3.0, max_tokens=10, prompt_tokens=10, error="client timeout"),
    ]
    s = summarize(records, window_s=2.0)
    assert s["requests"] == 4 and s["completed"] == 2
    assert s["errors"] == {"client timeout": 1, "http 429": 1}
    assert s["ttft_p50_ms"] == pytest.approx(200.0)  # of 100 and 300 ms
    assert s["itl_p50_ms"] == pytest.approx(100.0)
    assert s["tokens_per_s"] == 2.5  # 5 chunks in a 2 s window
    assert s["output_tokens"] == 5 and s["of_max_tokens"] == 0.25
    assert s["finish_reasons"] == {"length": 2}


def test_errors_by_kind_names_unfinished_streams() -> None:
    r = Streamed(sent=0.0, max_tokens=4, prompt_tokens=4, status=200)  # no [DONE]
    assert errors_by_kind([r]) == {"unfinished": 1}


def test_ratios_pair_each_stream_count() -> None:
    rows = [
        {"mode": "continuous", "streams": 64, "tokens_per_s": 300.0, "ttft_p95_ms": 50.0},
        {"mode": "static", "streams": 64, "tokens_per_s": 200.0, "ttft_p95_ms": 500.0},
        {"mode": "continuous", "streams": 256, "tokens_per_s": 100.0, "ttft_p95_ms": None},
    ]
    assert ratios(rows) == [{"streams": 64, "tokens_per_s": 1.5, "ttft_p95": 0.1, "itl_p95": None}]


def test_sse_events_split_anywhere() -> None:
    body = (
        b": waiting\n\n"
        b'id: 0\ndata: {"choices": [{"text": "Hel", "finish_reason": null}]}\n\n'
        b'id: 1\ndata: {"choices": [{"text": "lo", "finish_reason": "length"}]}\n\n'
        b'data: {"choices": [], "usage": {"completion_tokens": 2}}\n\n'
        b"data: [DONE]\n\n"
    )
    for cut in range(1, len(body)):
        p = SseParser()
        events = p.feed(body[:cut]) + p.feed(body[cut:])
        assert [e.id for e in events] == [0, 1, None, None]
        assert events[-1].data == b"[DONE]"


def test_apply_reads_text_usage_errors_and_the_end() -> None:
    r = Streamed(sent=0.0, max_tokens=4, prompt_tokens=4, status=200)
    assert not apply(r, Event(b'{"choices": [{"text": "a", "finish_reason": null}]}', 0), 1.0, 9)
    assert not apply(r, Event(b'{"choices": [{"text": "", "finish_reason": "stop"}]}', 1), 2.0, 9)
    assert not apply(r, Event(b'{"choices": [], "usage": {"completion_tokens": 2}}'), 2.0, 9)
    assert apply(r, Event(b"[DONE]"), 2.1, 9)
    assert (r.chunks, r.usage_tokens, r.finish_reason, r.done) == (1, 2, "stop", 2.1)
    assert r.completed
    bad = Streamed(sent=0.0, max_tokens=4, prompt_tokens=4, status=200)
    apply(bad, Event(b'{"error": {"message": "m", "type": "expired"}}'), 1.0, 9)
    apply(bad, Event(b"[DONE]"), 1.0, 9)
    assert bad.error == "stream expired" and not bad.completed


def test_prompts_are_seeded_and_fit_the_context() -> None:
    pytest.importorskip("tokenizers")
    from bench.gpuhost.genload import prompts

    a, b = prompts(200, seed=3), prompts(200, seed=3)
    assert a == b and a != prompts(200, seed=4)
    mix = Mix()
    for p in a:
        assert p.tokens + p.max_tokens <= CONTEXT
        assert mix.output_range[0] <= p.max_tokens <= mix.output_range[1]
        assert p.tokens >= 1
    lengths = sorted(p.tokens for p in a)
    assert lengths[0] < 40 and lengths[-1] > 150  # mixed, not one length


def _req(i: int, rank: int = 0) -> GenRequest:
    return GenRequest(seq_id=f"s{i}", prompt=(1, 2, 3, 4), max_tokens=4, rank=rank)


def test_static_batch_forms_only_when_empty_from_every_rank() -> None:
    cfg = PolicyConfig(num_blocks=64, block_size=16, max_step_tokens=64, max_running=8)
    policy = ServedStaticBatcher(cfg, lambda ids: "x" * len(ids), eos_id=None)
    assert policy.cfg.kv_overcommit == 1.0
    policy.add(_req(0, rank=2))  # not the most urgent class: still served
    policy.add(_req(1))
    policy.schedule(0.0)
    assert {s.seq_id for s in policy.running} == {"s0", "s1"}
    policy.add(_req(2))
    policy.schedule(0.1)
    assert {s.seq_id for s in policy.running} == {"s0", "s1"}  # waits for the batch
    assert policy.num_waiting == 1


def test_the_hook_swaps_the_policy_in_a_scheduler_only_when_asked() -> None:
    from bench.gpuhost.generation import mode_env

    code = "import scheduler.runtime.generation.engine as e; print(e.ContinuousBatcher.__name__)"
    for mode, want in (("static", "ServedStaticBatcher"), ("continuous", "ContinuousBatcher")):
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.update(mode_env(mode, env))
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == want
    with pytest.raises(ValueError):
        mode_env("plain", {})
