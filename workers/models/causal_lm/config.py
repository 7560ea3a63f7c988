"""The causal LM's shape. The numbers are decision 23's (size, and why)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class LMConfig:
    vocab_size: int = 2048
    d_model: int = 160
    n_layer: int = 4
    n_head: int = 5  # head_dim 32
    # One key/value head shared by all query heads (multi-query attention): the KV
    # cache is 5x smaller, so 5x the sequences fit, and a decode step reads 5x fewer
    # cache bytes, which at batch 48 x 300 tokens was most of the step on this CPU.
    n_kv_head: int = 1
    d_ff: int = 640
    max_len: int = 512  # positions the model has embeddings for: prompt + output
    dropout: float = 0.1  # training only, on the residual paths

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def kv_dim(self) -> int:
        return self.n_kv_head * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV-cache bytes one token holds: a key and a value per layer."""
        return 2 * self.n_layer * self.kv_dim * dtype_bytes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LMConfig:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})
