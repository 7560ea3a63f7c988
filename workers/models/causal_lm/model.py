"""A small decoder-only transformer (GPT-style: pre-LayerNorm, learned positions,
tied input and output embeddings).

Two ways in. ``forward`` runs whole sequences with a causal mask (training).
``hidden`` runs a flat list of new tokens, any number of sequences packed together
with no padding, and leaves attention to an ``Attention`` object that owns the KV
cache: the paged pool (``paged.py``) for continuous batching, or one contiguous
buffer per request (``ContiguousCache``) for the plain per-request loop. Every
linear layer then runs once over all the step's tokens, which is what batching buys.
"""

from __future__ import annotations

import contextlib
import math
from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from workers.models.causal_lm.config import LMConfig


class Attention(Protocol):
    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Store ``k``/``v`` (new tokens, [N, heads, head_dim]) in the cache and return
        the attention output for ``q`` over each token's own sequence, same shape."""
        ...


class Block(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, cfg.d_model + 2 * cfg.kv_dim)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, cfg.d_ff)
        self.out = nn.Linear(cfg.d_ff, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def mlp(self, x: Tensor) -> Tensor:
        return self.drop(self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh")))

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries [..., heads, hd], keys and values [..., kv_heads, hd]."""
        c = self.cfg
        q, k, v = self.qkv(self.ln1(x)).split([c.d_model, c.kv_dim, c.kv_dim], dim=-1)
        lead = x.shape[:-1]
        return (
            q.view(*lead, c.n_head, c.head_dim),
            k.view(*lead, c.n_kv_head, c.head_dim),
            v.view(*lead, c.n_kv_head, c.head_dim),
        )

    def forward(self, x: Tensor) -> Tensor:
        """Whole sequences [B, T, d] under a causal mask."""
        b, t, d = x.shape
        q, k, v = (y.transpose(1, 2) for y in self._qkv(x))
        # No dropout on attention weights: it forces SDPA's slow path (7x per step on CPU).
        a = attend(q, k, v, None, causal=True)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, t, d)))
        return x + self.mlp(x)

    def step(self, x: Tensor, layer: int, attention: Attention) -> Tensor:
        """Packed new tokens [N, d]; attention over the cache."""
        n, d = x.shape
        q, k, v = self._qkv(x)
        x = x + self.proj(attention(layer, q, k, v).reshape(n, d))
        return x + self.mlp(x)


class CausalLM(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.apply(self._init)
        # GPT-2's scaling of residual projections by depth keeps early training stable.
        for name, p in self.named_parameters():
            if name.endswith(("proj.weight", "out.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def logits(self, h: Tensor) -> Tensor:
        return self.ln_f(h) @ self.tok.weight.T

    def forward(self, ids: Tensor) -> Tensor:
        """Logits [B, T, vocab] for whole sequences (training)."""
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.drop(self.tok(ids) + self.pos(pos))
        for block in self.blocks:
            x = block(x)
        return self.logits(x)

    def hidden(self, tokens: Tensor, positions: Tensor, attention: Attention) -> Tensor:
        """Final hidden states [N, d] of packed new tokens at their positions."""
        x = self.tok(tokens) + self.pos(positions)
        for i, block in enumerate(cast("list[Block]", self.blocks)):
            x = block.step(x, i, attention)
        return x


# cuDNN's attention builds an execution graph for every new shape (hundreds of ms each,
# sglang#4650, flashinfer#2545), and PyTorch may prefer it on Hopper. A serving step's
# shapes change nearly every step (who is in the batch, each context's length), so
# serving leaves it out: the flash and memory-efficient kernels need no per-shape build.
_NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def serving_attention(
    device: torch.device, cudnn: bool = False
) -> contextlib.AbstractContextManager[None]:
    """The attention kernels a serving step may use (``cudnn``: PyTorch's own choice,
    cuDNN included, which the GPU benchmark compares against)."""
    if device.type != "cuda" or cudnn:
        return contextlib.nullcontext()
    return sdpa_kernel(_NO_CUDNN)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool = False) -> Tensor:
    """[B, heads, Q, hd] queries over [B, kv_heads, L, hd] keys; ``mask`` [B, 1, Q, L]
    True where a key may be seen."""
    gqa = q.shape[1] != k.shape[1]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=gqa)


def attend_one(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """One query token per sequence: [B, heads, hd] over [B, kv_heads, L, hd] keys;
    ``mask`` [B, 1, 1, L]. The query heads that share a key/value head become that
    head's query rows, so keys and values are never repeated per query head: 1.8x
    faster than ``enable_gqa`` for 64 sequences of 464 tokens on this CPU."""
    b, h, hd = q.shape
    kvh = k.shape[1]
    out = F.scaled_dot_product_attention(q.view(b, kvh, h // kvh, hd), k, v, attn_mask=mask)
    return out.reshape(b, h, hd)


class ContiguousCache:
    """One request's KV cache as one preallocated buffer per layer (the plain loop)."""

    def __init__(self, cfg: LMConfig, length: int, device: torch.device, dtype: torch.dtype):
        shape = (cfg.n_layer, cfg.n_kv_head, length, cfg.head_dim)
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.length = 0  # tokens stored
        self._new = 0

    def begin(self, n_new: int) -> None:
        self._new = n_new

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        start, n = self.length, self._new
        self.k[layer, :, start : start + n] = k.transpose(0, 1)
        self.v[layer, :, start : start + n] = v.transpose(0, 1)
        keys = self.k[layer, :, : start + n].unsqueeze(0)
        values = self.v[layer, :, : start + n].unsqueeze(0)
        if n == 1:
            out = attend_one(q, keys, values, None)  # q is [1, heads, hd]
        else:
            qq = q.transpose(0, 1).unsqueeze(0)
            if start == 0:
                a = attend(qq, keys, values, None, causal=True)
            else:
                i = torch.arange(n, device=q.device).unsqueeze(1) + start
                j = torch.arange(start + n, device=q.device).unsqueeze(0)
                a = attend(qq, keys, values, (j <= i).view(1, 1, n, start + n))
            out = a.squeeze(0).transpose(0, 1)
        if layer == len(self.k) - 1:
            self.length += n
        return out
