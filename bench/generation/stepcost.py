"""What one step of the model costs on this machine, by decode batch size and by
prefill chunk size: the curve the token budget (decision 23) is read from."""

from __future__ import annotations

import statistics
import time
from typing import Any

from scheduler.core.generation.config import PolicyConfig
from scheduler.core.generation.engine import Engine
from scheduler.core.generation.policy import ContinuousBatcher
from scheduler.core.generation.sequence import GenRequest
from workers.models.causal_lm.model import CausalLM
from workers.models.causal_lm.runner import ModelRunner
from workers.models.causal_lm.tokenizer import Codec


def _engine(model: CausalLM, codec: Codec, budget: int, running: int) -> Engine:
    cfg = PolicyConfig(
        num_blocks=2048,
        block_size=16,
        max_step_tokens=budget,
        max_running=running,
        max_model_len=model.cfg.max_len,
    )
    return Engine(
        ContinuousBatcher(cfg, codec.decode, codec.eos_id),
        ModelRunner(model, cfg.num_blocks, cfg.block_size),
    )


def decode_ms(model: CausalLM, codec: Codec, batch: int, context: int, steps: int = 40) -> float:
    """Milliseconds per decode step of ``batch`` sequences at ``context`` tokens: the
    10th percentile of the steps, since every step does the same work and on a shared
    machine another process's burst only ever adds time."""
    eng = _engine(model, codec, max(batch, 512), batch)
    for i in range(batch):
        prompt = tuple((i * 7 + j) % 1000 + 1 for j in range(context))
        eng.submit(GenRequest(f"d{i}", prompt, 10_000, ignore_eos=True))
    while eng.last is None or eng.last.tokens != batch:  # until every prompt is in
        eng.step()
    for _ in range(3):
        eng.step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.quantiles(times, n=10)[0]


def prefill_ms(model: CausalLM, codec: Codec, tokens: int, repeat: int = 5) -> float:
    """Milliseconds for one step that prefills ``tokens`` prompt tokens of one sequence."""
    best = float("inf")
    for r in range(repeat + 1):
        eng = _engine(model, codec, tokens, 1)
        eng.submit(GenRequest(f"p{r}", tuple(range(1, tokens + 1)), 1, ignore_eos=True))
        t = time.perf_counter()
        eng.step()
        if r:  # the first is a warm-up
            best = min(best, 1000 * (time.perf_counter() - t))
    return best


def curve(model: CausalLM, codec: Codec) -> dict[str, Any]:
    return {
        "decode_ms_by_batch_ctx128": {
            b: round(decode_ms(model, codec, b, 128), 2) for b in (1, 2, 4, 8, 16, 32, 64, 128)
        },
        "decode_ms_batch32_by_ctx": {
            c: round(decode_ms(model, codec, 32, c), 2) for c in (32, 128, 256, 448)
        },
        "prefill_ms_by_tokens": {
            n: round(prefill_ms(model, codec, n), 2) for n in (16, 64, 128, 256, 384, 511)
        },
    }
