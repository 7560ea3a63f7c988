"""The continuous-batching policy's knobs, checked at construction (decision 23)."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator


def kv_blocks_for_budget(budget_bytes: int, bytes_per_token: int, block_size: int) -> int:
    """How many KV blocks a memory budget holds (bytes per token from the model's shape)."""
    return budget_bytes // (bytes_per_token * block_size)


class PolicyConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    num_blocks: int = Field(ge=1, description="KV-cache blocks in the pool (kv_blocks_for_budget)")
    block_size: int = Field(default=16, ge=1, le=1024, description="tokens per KV block")
    max_step_tokens: int = Field(
        default=256, ge=1, description="tokens computed per step: decodes plus prefill chunks"
    )
    max_running: int = Field(default=64, ge=1, description="sequences in the running batch")
    max_model_len: int = Field(default=512, ge=2, description="prompt + output tokens, at most")
    kv_overcommit: float = Field(
        default=math.inf,
        ge=1.0,
        description="admit while the running sequences' worst-case blocks (prompt + max_tokens) "
        "stay under this many times the pool; inf: admit on the blocks needed now",
    )
    ranks: int = Field(default=4, ge=1, description="priority classes; rank 0 is the most urgent")
    # Below any request's cost, so a turn admits about one request and tenants interleave
    # as finely as decision 9's one request per turn; fair.py skips rounds that serve
    # nobody, so a small quantum costs no extra work.
    drr_quantum: int = Field(default=16, ge=1, description="tokens of credit per fairness turn")

    @model_validator(mode="after")
    def _consistent(self) -> PolicyConfig:
        if self.max_running > self.max_step_tokens:
            raise ValueError(
                f"max_running ({self.max_running}) must not exceed max_step_tokens "
                f"({self.max_step_tokens}): every running sequence decodes one token a step"
            )
        if self.num_blocks * self.block_size < self.max_model_len:
            raise ValueError(
                f"num_blocks * block_size ({self.num_blocks * self.block_size} tokens) must hold "
                f"one max_model_len ({self.max_model_len}) sequence, or a long one never finishes"
            )
        return self

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)
