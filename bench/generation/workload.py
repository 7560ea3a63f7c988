"""The benchmark's requests: prompts cut from the shipped corpus, mixed lengths,
Poisson arrivals, all from one seed so every mode gets the very same work."""

from __future__ import annotations

import random
from dataclasses import dataclass

from scheduler.core.generation.sequence import GenRequest
from workers.models.causal_lm.corpus import CORPUS_PATH
from workers.models.causal_lm.tokenizer import Codec


@dataclass(frozen=True)
class Mix:
    prompt_min: int = 16  # tokens
    prompt_max: int = 192
    short_out: tuple[int, int] = (16, 64)  # most answers are short ...
    long_out: tuple[int, int] = (128, 256)  # ... some are long: static batching waits for them
    long_share: float = 0.3


def requests(
    codec: Codec, n: int, rate: float, seed: int = 1, mix: Mix = Mix(), at_once: bool = False
) -> list[tuple[float, GenRequest]]:
    """(arrival offset in seconds, request) in arrival order. ``ignore_eos``, so each
    request makes exactly ``max_tokens`` tokens and the work is the same in every mode."""
    rng = random.Random(seed)
    text = CORPUS_PATH.read_text(encoding="utf-8")
    ids = codec.encode(text[:200_000])
    out: list[tuple[float, GenRequest]] = []
    t = 0.0
    for i in range(n):
        plen = rng.randint(mix.prompt_min, mix.prompt_max)
        start = rng.randrange(len(ids) - plen)
        lo, hi = mix.long_out if rng.random() < mix.long_share else mix.short_out
        req = GenRequest(
            seq_id=f"g{i}",
            prompt=tuple(ids[start : start + plen]),
            max_tokens=rng.randint(lo, hi),
            ignore_eos=True,
        )
        out.append((t, req))
        if not at_once:
            t += rng.expovariate(rate)
    return out
