"""The policy's settings refuse combinations that cannot work, naming both fields."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from scheduler.core.generation.config import PolicyConfig, kv_blocks_for_budget


def test_running_cap_above_the_token_budget_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"max_running \(300\).*max_step_tokens \(256\)"):
        PolicyConfig(num_blocks=100, max_running=300, max_step_tokens=256)


def test_a_pool_smaller_than_one_sequence_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"num_blocks \* block_size.*max_model_len"):
        PolicyConfig(num_blocks=4, block_size=16, max_model_len=512)


def test_overcommit_below_one_is_refused() -> None:
    with pytest.raises(ValidationError, match="kv_overcommit"):
        PolicyConfig(num_blocks=100, kv_overcommit=0.5)


def test_blocks_from_a_memory_budget() -> None:
    # 64 MiB of fp32 KV for 4 layers of width 160: 5,120 bytes a token.
    per_token = 2 * 4 * 160 * 4
    assert kv_blocks_for_budget(64 * 2**20, per_token, 16) == 819
    cfg = PolicyConfig(num_blocks=819, block_size=16)
    assert cfg.blocks_for(16) == 1 and cfg.blocks_for(17) == 2 and cfg.drr_quantum == 16
