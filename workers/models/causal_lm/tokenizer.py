"""Training the model's tokenizer: byte-level BPE on the shipped corpus. No torch here.

Byte-level, so any UTF-8 text encodes (no unknown token) and decoding is exact; a
small BPE vocabulary (``VOCAB_SIZE``) rather than raw bytes, so a step of the model
advances about three characters of English instead of one. The trained tokenizer
ships in the core (core/models/lm_codec.py, ``Codec``), where the API and the
scheduler load it without torch.
"""

from __future__ import annotations

from typing import Any

from core.models.lm_codec import END_OF_TEXT, TOKENIZER_PATH, Codec

__all__ = ["TOKENIZER_PATH", "VOCAB_SIZE", "Codec", "train_tokenizer"]

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
