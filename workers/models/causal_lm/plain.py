"""One request at a time with a contiguous KV cache: the baseline continuous batching
is measured against, and the reference the tests compare its text with."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from core.generation import SampleSpec
from workers.models.causal_lm.model import CausalLM, ContiguousCache, serving_attention
from workers.models.causal_lm.sampling import pick


def generate(
    model: CausalLM,
    prompt: Sequence[int],
    max_tokens: int,
    *,
    eos_id: int | None = None,
    temperature: float = 0.0,
    seed: int = 0,
) -> list[int]:
    """The output tokens (a stop token, when one ends it, not included)."""
    return list(
        stream(model, prompt, max_tokens, eos_id=eos_id, temperature=temperature, seed=seed)
    )


def stream(
    model: CausalLM,
    prompt: Sequence[int],
    max_tokens: int,
    *,
    eos_id: int | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    cudnn_attention: bool = False,
) -> Iterator[int]:
    """The output tokens as they are made (a stop token ends it, not yielded)."""
    p = next(model.parameters())
    total = min(len(prompt) + max_tokens, model.cfg.max_len)
    cache = ContiguousCache(model.cfg, total, p.device, p.dtype)
    n_out = 0
    feed = list(prompt)
    while True:
        with torch.inference_mode(), serving_attention(p.device, cudnn_attention):
            cache.begin(len(feed))
            positions = torch.arange(cache.length, cache.length + len(feed), device=p.device)
            h = model.hidden(torch.tensor(feed, device=p.device), positions, cache)
            spec = SampleSpec(temperature, seed, n_out)
            token = pick(model.logits(h[-1:]).float(), [spec])[0]
        if token == eos_id:
            return
        yield token
        n_out += 1
        if n_out >= max_tokens or len(prompt) + n_out >= total:
            return
        feed = [token]
