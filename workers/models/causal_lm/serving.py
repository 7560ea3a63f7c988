"""The causal LM as a worker serves it: steps of continuous batching, not batches.

The scheduler's policy (scheduler/core/generation/) plans each step and sends it as a
``GenStep``; this model runs it on a paged KV pool and returns the sampled tokens. A
pool belongs to one scheduler connection: each scheduler's policy hands out block ids
of its own, so a worker serving several schedulers (decision 14) keeps a pool for
each, all of them reading the one copy of the weights. The pool is sized here, from
the worker's memory budget (``lm_kv_cache_mb``), and announced with the step limits
(``GenerationInfo``) so the policy plans within them.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from core.generation import Chunk, SampleSpec, StepOutput, StepPlan
from core.models.causal_lm import CausalLMSpec
from core.protocol import GenerationInfo
from workers.models.base import Model
from workers.models.causal_lm import weights
from workers.models.causal_lm.runner import ModelRunner, default_dtype

log = logging.getLogger(__name__)

# Tokens a KV block holds (decision 23: at most 15 slots wasted a sequence, 3% of 512).
BLOCK_SIZE = 16


def resolve_device(setting: str) -> torch.device:
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(setting)


def blocks_for_budget(budget_bytes: int, bytes_per_token: int, block_size: int) -> int:
    """KV blocks a memory budget holds (the policy's ``kv_blocks_for_budget``)."""
    return budget_bytes // (bytes_per_token * block_size)


class CausalLMModel(Model):
    def __init__(
        self,
        spec: CausalLMSpec,
        *,
        device: str = "auto",
        kv_cache_mb: int = 64,
        max_step_tokens: int = 256,
        max_running: int = 64,
        cpu_threads: int = 1,
    ):
        self.spec = spec
        dev = resolve_device(device)
        if dev.type == "cpu":
            torch.set_num_threads(cpu_threads)
        dtype = default_dtype(dev)
        self.lm = weights.load_version(
            spec.artifact, spec.weights_seed, spec.weights_noise, dev, dtype
        )
        cfg = self.lm.cfg
        if cfg.max_len != spec.context_length:
            raise ValueError(
                f"the weights hold {cfg.max_len} positions; {spec.ref} promises "
                f"{spec.context_length}"
            )
        per_token = cfg.kv_bytes_per_token(torch.empty((), dtype=dtype).element_size())
        blocks = blocks_for_budget(kv_cache_mb << 20, per_token, BLOCK_SIZE)
        # The policy needs room for one whole context and a token a step per sequence.
        need = -(-cfg.max_len // BLOCK_SIZE)
        if blocks < need:
            raise ValueError(
                f"lm_kv_cache_mb={kv_cache_mb} holds {blocks} blocks; one context needs {need}"
            )
        self.info = GenerationInfo(
            num_blocks=blocks,
            block_size=BLOCK_SIZE,
            max_model_len=cfg.max_len,
            max_step_tokens=max(max_step_tokens, max_running),
            max_running=max_running,
        )
        self.device = dev
        self._runners: dict[Hashable, ModelRunner] = {}
        log.info(
            "%s on %s (%s): %d KV blocks of %d tokens (%d MiB)",
            spec.ref,
            dev,
            dtype,
            blocks,
            BLOCK_SIZE,
            kv_cache_mb,
        )

    def predict(self, inputs: Sequence[Any], params: dict[str, Any]) -> Sequence[Any]:
        raise TypeError(f"{self.spec.ref} generates: it runs steps (GenStep), not batches")

    def generation_info(self) -> GenerationInfo:
        return self.info

    def step(self, key: Hashable, plan: StepPlan) -> StepOutput:
        """Run ``plan`` on the pool of the scheduler ``key`` (made on its first step)."""
        runner = self._runners.get(key)
        if runner is None:
            runner = self._runners[key] = ModelRunner(
                self.lm, self.info.num_blocks, self.info.block_size
            )
        return runner.execute(plan)

    def release(self, key: Hashable) -> None:
        """The scheduler ``key`` went away: its pool's memory goes back."""
        self._runners.pop(key, None)

    def warmup(self) -> dict[int, float]:
        """A prefill and a few decode steps on a scratch pool, so the first request does
        not pay for lazy initialisation; generation has no batch-size profile."""
        prompt = tuple(range(1, 33))
        blocks = tuple(range(-(-(len(prompt) + 4) // BLOCK_SIZE)))
        key = object()
        first = Chunk("w", prompt, 0, blocks, SampleSpec())
        out = self.step(key, StepPlan(0, (first,), BLOCK_SIZE))
        pos = len(prompt)
        for i in range(3):
            token = out.sampled["w"]
            chunk = Chunk("w", (token,), pos, blocks, SampleSpec())
            out = self.step(key, StepPlan(i + 1, (chunk,), BLOCK_SIZE))
            pos += 1
        self.release(key)
        return {}
