"""BERT WordPiece tokenization of ASCII text in a few microseconds, the same ids as the
model's own tokenizer.

The API tier tokenizes every accepted embedding input (core/models/embedding.py), and
``tokenizers`` spends about 2.7 µs a token there (Rust, but through its whole
normalizer, pre-tokenizer, offsets and post-processor pipeline: 174 µs for a 63-token
paragraph, 24 µs for a short query), which held a GPU host's job submission to 7,000
items/s on one API process. Almost all input is ASCII, where BERT's rules are few:

1. clean: ASCII control characters other than tab, newline and carriage return are
   dropped; those three become spaces;
2. lowercase (accent stripping has nothing to strip in ASCII, CJK spacing nothing to
   space);
3. split on whitespace, and every punctuation character (all printable ASCII that is
   not a letter, a digit or a space) is a word of its own;
4. each word becomes its WordPiece pieces: longest match first, ``##`` before every
   piece but the first; a word longer than ``max_input_chars_per_word`` or with a
   part the vocabulary lacks is ``[UNK]``;
5. ``[CLS]`` + the first ``max_tokens - 2`` ids + ``[SEP]``.

A word's pieces are cached (words repeat: a corpus has far fewer distinct words than
words). Text that is not ASCII, or that contains one of the tokenizer's added tokens
(``[MASK]`` typed into the input is one token, not three), goes to the model's own
tokenizer. ``from_tokenizer`` builds this only for a tokenizer whose configuration is
exactly the one above and otherwise answers None, so a model with other rules keeps its
own tokenizer. tests/unit/core/test_wordpiece.py checks ids equal on generated and
adversarial text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from itertools import chain
from typing import Any

# Control characters cleaning drops (tab, newline and carriage return become spaces).
_CLEAN = {c: None for c in (*range(0, 9), 11, 12, *range(14, 32), 127)} | {9: 32, 10: 32, 13: 32}
# After cleaning and lowercasing: runs of letters and digits, or one punctuation mark.
_WORDS = re.compile(r"[a-z0-9]+|[^a-z0-9 ]")
_CACHE_LIMIT = 1 << 18  # distinct words kept (a few tens of MB at most)


class FastWordPiece:
    def __init__(
        self,
        vocab: dict[str, int],
        *,
        unk: str,
        cls_id: int,
        sep_id: int,
        max_tokens: int,
        max_chars_per_word: int,
        added: tuple[str, ...],
        fallback: Callable[[str], list[int]],
    ) -> None:
        self.vocab = vocab
        self.unk_id = vocab[unk]
        self.cls_id = cls_id
        self.sep_id = sep_id
        self.room = max_tokens - 2
        self.max_chars = max_chars_per_word
        self.added = added
        self.fallback = fallback
        self._pieces: dict[str, tuple[int, ...]] = {}

    @classmethod
    def from_tokenizer(cls, tok: Any, max_tokens: int) -> FastWordPiece | None:
        """For a ``tokenizers.Tokenizer`` with BERT's uncased rules; None otherwise."""
        try:
            conf = json.loads(tok.to_str())
        except Exception:
            return None
        parts = ("normalizer", "pre_tokenizer", "model", "post_processor")
        norm, pre, model, post = (conf.get(k) or {} for k in parts)
        if not (
            norm.get("type") == "BertNormalizer"
            and norm.get("clean_text") is True
            and norm.get("lowercase") is True
            and norm.get("strip_accents") in (None, True)
            and pre.get("type") == "BertPreTokenizer"
            and model.get("type") == "WordPiece"
            and model.get("continuing_subword_prefix") == "##"
            and post.get("type") == "TemplateProcessing"
            and [next(iter(x)) for x in post.get("single", [])]
            == ["SpecialToken", "Sequence", "SpecialToken"]
        ):
            return None
        specials = post.get("special_tokens", {})
        first, _, last = post["single"]
        try:
            (cls_id,) = specials[first["SpecialToken"]["id"]]["ids"]
            (sep_id,) = specials[last["SpecialToken"]["id"]]["ids"]
        except (KeyError, ValueError):
            return None
        vocab = tok.get_vocab(with_added_tokens=False)
        added = tuple(sorted(a["content"] for a in conf.get("added_tokens", [])))
        unk = model.get("unk_token", "[UNK]")
        if unk not in vocab:
            return None

        def fallback(text: str) -> list[int]:
            return list(tok.encode(text).ids)

        return cls(
            vocab,
            unk=unk,
            cls_id=cls_id,
            sep_id=sep_id,
            max_tokens=max_tokens,
            max_chars_per_word=int(model.get("max_input_chars_per_word", 100)),
            added=added,
            fallback=fallback,
        )

    def encode(self, text: str) -> list[int]:
        """[CLS] ... [SEP] ids of ``text``, truncated to ``max_tokens``."""
        if not text.isascii() or ("[" in text and any(a in text for a in self.added)):
            return self.fallback(text)
        words = _WORDS.findall(text.translate(_CLEAN).lower())
        pieces = self._pieces
        try:
            found = [pieces[w] for w in words]
        except KeyError:
            found = [pieces.get(w) or self._learn(w) for w in words]
        ids = [self.cls_id, *chain.from_iterable(found)]
        if len(ids) > self.room + 1:
            del ids[self.room + 1 :]
        ids.append(self.sep_id)
        return ids

    def _learn(self, word: str) -> tuple[int, ...]:
        got = self._wordpiece(word)
        if len(self._pieces) < _CACHE_LIMIT:
            self._pieces[word] = got
        return got

    def _wordpiece(self, word: str) -> tuple[int, ...]:
        if len(word) > self.max_chars:
            return (self.unk_id,)
        out = []
        start, n = 0, len(word)
        vocab = self.vocab
        while start < n:
            end = n
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                got = vocab.get(piece)
                if got is not None:
                    out.append(got)
                    break
                end -= 1
            else:
                return (self.unk_id,)
            start = end
        return tuple(out)
