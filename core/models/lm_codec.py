"""The causal LM's tokenizer: text <-> token ids, without torch.

Byte-level BPE (``tokenizers``), trained with the model on its corpus
(workers/models/causal_lm/tokenizer.py trains it, decision 23): any UTF-8 text encodes
(no unknown token) and decoding is exact. It lives in the core because three stages
use it: the API counts and encodes a prompt when it accepts it, the scheduler decodes
the tokens its continuous-batching policy releases (and encodes job items' prompts),
and the worker's training script writes it. ``tokenizers`` is imported when the file
is first loaded, never at import time (importing the model catalog must stay cheap).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

END_OF_TEXT = "<|endoftext|>"  # separates documents in training; a stop token in serving
TOKENIZER_PATH = Path(__file__).with_name("data") / "lm_tokenizer.json"


class Codec:
    """Text <-> token ids for the causal LM (a thin, typed face on ``tokenizers``)."""

    def __init__(self, tokenizer: Any):
        self._tok = tokenizer
        eos = tokenizer.token_to_id(END_OF_TEXT)
        if eos is None:
            raise ValueError(f"tokenizer has no {END_OF_TEXT!r} token")
        self.eos_id: int = eos
        self.vocab_size: int = tokenizer.get_vocab_size()

    @classmethod
    def load(cls, path: Path = TOKENIZER_PATH) -> Codec:
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)))

    def save(self, path: Path) -> None:
        self._tok.save(str(path))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)

    def decode(self, ids: Sequence[int]) -> str:
        # The end-of-text token is a stop signal, never part of an answer's text.
        return str(self._tok.decode([i for i in ids if i != self.eos_id]))


_lock = threading.Lock()
_shared: Codec | None = None


def shared_codec() -> Codec:
    """The shipped tokenizer, loaded once per process (thread-safe)."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = Codec.load()
        return _shared
