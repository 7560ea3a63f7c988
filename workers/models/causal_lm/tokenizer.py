"""The model's tokenizer: byte-level BPE trained on the shipped corpus. No torch here.

Byte-level, so any UTF-8 text encodes (no unknown token) and decoding is exact; a
small BPE vocabulary (``VOCAB_SIZE``) rather than raw bytes, so a step of the model
advances about three characters of English instead of one. The trained
``tokenizer.json`` ships beside the weights; the API tier can load it without torch
to count a prompt's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workers.models.causal_lm.corpus import DATA_DIR, END_OF_TEXT

TOKENIZER_PATH = DATA_DIR / "tokenizer.json"
# 2,048 merges cover the corpus's common words whole while the embedding table stays
# small (2,048 x d_model); measured: 248 KB of corpus -> about 80k tokens.
VOCAB_SIZE = 2048


def train_tokenizer(text: str, vocab_size: int = VOCAB_SIZE) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    docs = [d for d in text.split(END_OF_TEXT) if d]
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


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
