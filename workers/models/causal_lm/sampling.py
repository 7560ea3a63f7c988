"""Picking the next token: greedy, or temperature sampling reproducible per request.

The noise for output token ``index`` of a request with ``seed`` comes from a
generator seeded with a hash of (seed, index) alone (Gumbel-max: argmax of
logits / T plus Gumbel noise is a draw from softmax(logits / T)). So the draw does
not depend on the batch the sequence ran in, on the tokens drawn before, or on a
preemption that made it recompute: the same request gives the same text.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from core.generation import SampleSpec

_MASK = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def noise_seed(seed: int, index: int) -> int:
    # torch.Generator takes seeds below 2**63 here; the top bit is dropped.
    return splitmix64(splitmix64(seed & _MASK) ^ index) >> 1


def gumbel(vocab: int, seed: int, index: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(noise_seed(seed, index))
    u = torch.rand(vocab, generator=g, dtype=torch.float64).clamp_(1e-300, 1.0)
    return -torch.log(-torch.log(u))


def pick(logits: torch.Tensor, specs: Sequence[SampleSpec]) -> list[int]:
    """One token per row of ``logits`` [rows, vocab]."""
    out = logits.argmax(dim=-1).tolist()  # greedy rows: one op on the device
    hot = [i for i, s in enumerate(specs) if s.temperature > 0]
    if hot:
        rows = logits[hot].to("cpu", torch.float64)
        for j, i in enumerate(hot):
            s = specs[i]
            scores = rows[j] / s.temperature + gumbel(rows.shape[1], s.seed, s.index)
            out[i] = int(scores.argmax())
    return [int(x) for x in out]
