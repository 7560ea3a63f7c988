"""Runs one ``StepPlan`` on the model: the worker's half of continuous batching.

It holds the model and the KV pool and nothing per sequence: the plan says which
tokens go where, so any plan from any policy instance can run, and a restarted
policy only has to recompute. All the step's tokens (decodes and prefill chunks of
every sequence) go through each linear layer together; only the last token of a
sampling chunk goes through the output layer.
"""

from __future__ import annotations

import time

import torch

from core.generation import StepOutput, StepPlan
from workers.models.causal_lm import weights
from workers.models.causal_lm.model import CausalLM, serving_attention
from workers.models.causal_lm.paged import KVPool, PagedStep
from workers.models.causal_lm.sampling import pick


def default_dtype(device: torch.device) -> torch.dtype:
    # fp32 on CPU (no fast half-precision matmul there); bf16 on a GPU.
    return torch.bfloat16 if device.type == "cuda" else torch.float32


class ModelRunner:
    def __init__(
        self, model: CausalLM, num_blocks: int, block_size: int, cudnn_attention: bool = False
    ):
        p = next(model.parameters())
        self.model = model
        self.device = p.device
        self.cudnn_attention = cudnn_attention  # see model.serving_attention
        self.pool = KVPool(model.cfg, num_blocks, block_size, p.device, p.dtype)

    @classmethod
    def load(
        cls,
        num_blocks: int,
        block_size: int,
        device: str = "cpu",
        dtype: torch.dtype | None = None,
    ) -> ModelRunner:
        dev = torch.device(device)
        return cls(weights.load(dev, dtype or default_dtype(dev)), num_blocks, block_size)

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepOutput:
        with serving_attention(self.device, self.cudnn_attention):
            return self._execute(plan)

    def _execute(self, plan: StepPlan) -> StepOutput:
        started = time.perf_counter()
        if not plan.chunks:
            return StepOutput(plan.step, {}, 0.0)
        if plan.block_size != self.pool.block_size:
            raise ValueError(f"plan block size {plan.block_size}, pool {self.pool.block_size}")
        tokens: list[int] = []
        positions: list[int] = []
        rows: list[int] = []
        for c in plan.chunks:
            tokens.extend(c.tokens)
            positions.extend(range(c.start, c.start + len(c.tokens)))
            if c.sample is not None:
                rows.append(len(tokens) - 1)
        dev = self.device
        step = PagedStep(self.pool, plan.chunks, dev)
        h = self.model.hidden(
            torch.tensor(tokens, device=dev), torch.tensor(positions, device=dev), step
        )
        sampled: dict[str, int] = {}
        if rows:
            logits = self.model.logits(h[torch.tensor(rows, device=dev)]).float()
            takers = [c for c in plan.chunks if c.sample is not None]
            ids = pick(logits, [c.sample for c in takers if c.sample is not None])
            sampled = {c.seq_id: t for c, t in zip(takers, ids, strict=True)}
        return StepOutput(plan.step, sampled, time.perf_counter() - started)
