"""The paged KV cache on the runner's side: the pool's tensors and attention over it.

Keys and values live in one tensor per kind, ``[layers, blocks * block_size,
kv_heads, head_dim]``; token ``p`` of a sequence sits in slot ``table[p // bs] * bs + p % bs``.
A step writes its new tokens' keys and values into their slots, then gathers each
sequence's context into a contiguous tensor for ``scaled_dot_product_attention``:
decoding sequences all at once (padded to the longest, masked), prefill chunks one
by one (causal inside the chunk). The gather copies the context every layer; on a
GPU a paged-attention kernel (FlashAttention's or FlashInfer's block-table variants,
vLLM's PagedAttention) reads the blocks in place instead, and decode steps are
replayed from CUDA graphs (decision 23).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from core.generation import Chunk
from workers.models.causal_lm.config import LMConfig
from workers.models.causal_lm.model import attend, attend_one


class KVPool:
    def __init__(
        self,
        cfg: LMConfig,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
    ):
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (cfg.n_layer, num_blocks * block_size, cfg.n_kv_head, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)

    @property
    def bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


@dataclass
class _DecodeGroup:
    """Decoding sequences attended together, padded to the longest of them."""

    rows: Tensor  # their rows in the step's flat token order
    blocks: Tensor  # [sequences * width] block ids (padding: block 0, masked)
    shape: tuple[int, int]  # (sequences, width * block_size)
    mask: Tensor  # [sequences, 1, 1, width * block_size]: True where a key is real


def _groups(lens: list[int]) -> list[list[int]]:
    """Indices of ``lens`` grouped by length (shortest first): a new group starts where
    a context is over twice the group's shortest. On the CPU benchmark's workload (64
    running sequences) a step attends over 1.36x the real keys in 3.5 groups, instead
    of 1.92x padded to the longest in one."""
    order = sorted(range(len(lens)), key=lambda i: lens[i])
    out: list[list[int]] = []
    for i in order:
        if out and lens[i] <= 2 * lens[out[-1][0]]:
            out[-1].append(i)
        else:
            out.append([i])
    return out


class PagedStep:
    """Attention for one step's chunks (the ``Attention`` of model.py).

    Contexts are gathered block by block (``block_size`` tokens of keys in one
    contiguous copy), not token by token: the same bytes in 16x fewer pieces."""

    def __init__(self, pool: KVPool, chunks: Sequence[Chunk], device: torch.device):
        self.pool = pool
        bs = pool.block_size
        # The new tokens' slots in the step's row order, computed as plain ints and made
        # one tensor: a tensor op per sequence (and a split per decode) cost more host
        # time than the step's kernels at a few hundred sequences (docs/bench/generation.md).
        slots: list[int] = []
        decodes: list[tuple[int, tuple[int, ...], int]] = []  # row, block table, length
        self.prefills: list[tuple[int, int, int, Tensor]] = []  # row, n, start, block ids
        row = 0
        for c in chunks:
            n = len(c.tokens)
            if n == 1:
                decodes.append((row, c.blocks, c.start + 1))
                slots.append(c.blocks[c.start // bs] * bs + c.start % bs)
            else:
                used = -(-(c.start + n) // bs)
                table = torch.tensor(c.blocks[:used], dtype=torch.long)
                self.prefills.append((row, n, c.start, table.to(device)))
                blocks = c.blocks
                slots.extend(blocks[p // bs] * bs + p % bs for p in range(c.start, c.start + n))
            row += n
        self.decodes: list[_DecodeGroup] = []
        for group in _groups([d[2] for d in decodes]):
            members = [decodes[i] for i in group]
            width = max(-(-length // bs) for _, _, length in members)
            tables = torch.tensor(
                [t[:width] + (0,) * (width - len(t[:width])) for _, t, _ in members]
            )
            lens = torch.tensor([length for _, _, length in members])
            pos = torch.arange(width * bs)
            self.decodes.append(
                _DecodeGroup(
                    rows=torch.tensor([r for r, _, _ in members], device=device),
                    blocks=tables.flatten().to(device),
                    shape=(len(members), width * bs),
                    mask=(pos < lens.unsqueeze(1)).view(len(members), 1, 1, -1).to(device),
                )
            )
        self.slots = torch.tensor(slots, dtype=torch.long, device=device)

    def _blocks(self, cache: Tensor) -> Tensor:
        """The layer's cache as [blocks, block_size, heads, head_dim] (a view)."""
        return cache.view(self.pool.num_blocks, self.pool.block_size, *cache.shape[1:])

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        kc, vc = self.pool.k[layer], self.pool.v[layer]
        kc.index_copy_(0, self.slots, k)
        vc.index_copy_(0, self.slots, v)
        kb, vb = self._blocks(kc), self._blocks(vc)
        out = torch.empty_like(q)
        for g in self.decodes:
            shape = (*g.shape, *kc.shape[1:])
            qd = q.index_select(0, g.rows)  # [B, heads, hd]
            kd = kb.index_select(0, g.blocks).view(shape).transpose(1, 2)  # [B, kvh, L, hd]
            vd = vb.index_select(0, g.blocks).view(shape).transpose(1, 2)
            out.index_copy_(0, g.rows, attend_one(qd, kd, vd, g.mask))
        for row, n, start, table in self.prefills:
            ctx = start + n
            qp = q[row : row + n].transpose(0, 1).unsqueeze(0)
            kp = kb.index_select(0, table).flatten(0, 1)[:ctx].transpose(0, 1).unsqueeze(0)
            vp = vb.index_select(0, table).flatten(0, 1)[:ctx].transpose(0, 1).unsqueeze(0)
            if start == 0:
                a = attend(qp, kp, vp, None, causal=True)
            else:
                i = torch.arange(n, device=q.device).unsqueeze(1) + start
                j = torch.arange(ctx, device=q.device).unsqueeze(0)
                a = attend(qp, kp, vp, (j <= i).view(1, 1, n, ctx))
            out[row : row + n] = a.squeeze(0).transpose(0, 1)
        return out
