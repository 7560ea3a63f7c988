"""``all-minilm-l6-v2``: 384-dim sentence embeddings (mean pooling, optional L2 norm).

This module stays light: ingest imports it to validate requests. torch, tokenizers
and the weights are imported by ``load()`` only (see embedding_runtime.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workers.models.base import Model, ModelSpec, ParamSpec


@dataclass
class EmbedSpec(ModelSpec):
    device: str = "auto"  # "auto": cuda when available, else cpu
    max_tokens: int = 256  # inputs are truncated to this many tokens ([CLS]/[SEP] included)
    model_dir: str | None = None  # None: $GRISTMILL_EMBED_MODEL_DIR, else the PyPI package
    dtype: str = "auto"  # auto: fp16 on CUDA, fp32 on CPU
    # Padded tokens per sub-batch: past the GPU's launch-bound knee, small enough to keep
    # padding waste and activation memory low (docs/bench/gpu.md).
    bucket_tokens: int = 32_768
    cuda_graphs: bool = True  # replay captured graphs instead of launching ~80 kernels each
    # The API tier tokenizes accepted input and the message carries the ids: the worker,
    # which the GPU waits on, then only packs them (docs/bench/gpu.md).
    tokenize_in_api: bool = True
    params: tuple[ParamSpec, ...] = field(
        default_factory=lambda: (ParamSpec("normalize", bool, True, batching=True),)
    )

    def message_input(self, value: Any) -> Any:
        if not self.tokenize_in_api:
            return value
        from core.models.text_tokenizer import shared_tokenizer
        from core.models.token_ids import tokenized_input

        tok = shared_tokenizer(self.model_dir, self.max_tokens)
        return value if tok is None else tokenized_input(value, tok.encode(value).ids)

    def load(self) -> Model:
        from workers.models.embedding_runtime import EmbeddingModel

        return EmbeddingModel(self)
