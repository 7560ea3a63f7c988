"""The fast WordPiece path gives exactly the ids of the model's own tokenizer: on
generated ASCII, on the edges of BERT's rules (control characters, punctuation, long
words, unknown pieces, truncation, added tokens typed into the text) and, through the
fallback, on text that is not ASCII."""

from __future__ import annotations

import random
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.models.text_tokenizer import load_tokenizer, model_files_dir, shared_encoder
from core.models.wordpiece import FastWordPiece

MAX_TOKENS = 256


@pytest.fixture(scope="module")
def pair() -> tuple[object, FastWordPiece]:
    tok = load_tokenizer(model_files_dir(), MAX_TOKENS)
    fast = FastWordPiece.from_tokenizer(tok, MAX_TOKENS)
    assert fast is not None, "all-MiniLM-L6-v2's tokenizer has BERT's uncased rules"
    return tok, fast


def ids(pair: tuple[object, FastWordPiece], text: str) -> tuple[list[int], list[int]]:
    """The fast path's ids and the model tokenizer's for ``text``."""
    tok, fast = pair
    return fast.encode(text), list(tok.encode(text).ids)  # type: ignore[attr-defined]


EDGES = [
    "",
    " ",
    "Hello, World!",
    "HELLO world... isn't it?",
    "a\tb\nc\rd",
    "tab\x0bvertical\x0cfeed",
    "ctrl\x01in\x1fside\x7fword",
    "nul\x00byte",
    "x" * 101,
    "x" * 100,
    "supercalifragilisticexpialidocious unbelievably",
    "e-mail: someone@example.com; path=/a/b?c=d&e=f#frag",
    "3.14159 1,000,000 2026-11-27T11:15:36Z",
    "[MASK] is special",
    "not [mask] lowercase",
    "[CLS] [SEP] [PAD] [UNK]",
    "brackets [ ] and [MA SK]",
    "`~!@#$%^&*()_+-={}|[]\\:\";'<>?,./",
    "word " * 400,  # truncated at 254 pieces
    "café naïve",  # not ASCII: the model's tokenizer
    "日本語のテキスト",
    "emoji 🙂 ok",
]


@pytest.mark.parametrize("text", EDGES)
def test_edges(pair: tuple[object, FastWordPiece], text: str) -> None:
    got, want = ids(pair, text)
    assert got == want, repr(text)


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=127), max_size=300))
def test_any_ascii_text(pair: tuple[object, FastWordPiece], text: str) -> None:
    got, want = ids(pair, text)
    assert got == want, repr(text)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=80))
def test_any_text_at_all(pair: tuple[object, FastWordPiece], text: str) -> None:
    got, want = ids(pair, text)
    assert got == want, repr(text)


def test_a_corpus_of_real_words(pair: tuple[object, FastWordPiece]) -> None:
    tok = pair[0]
    words = [w for w in tok.get_vocab() if w.isascii() and w.isalpha()]  # type: ignore[attr-defined]
    rng = random.Random(7)
    for _ in range(2000):
        n = rng.randint(1, 300)
        text = " ".join(
            rng.choice(words) + rng.choice(["", "", "", ",", ".", "s", "ing", "'s"])
            for _ in range(n)
        )
        if rng.random() < 0.3:
            text = text.title()
        if rng.random() < 0.2:
            text += " " + "".join(rng.choice(string.printable) for _ in range(20))
        got, want = ids(pair, text)
        assert got == want, repr(text)


def test_other_tokenizers_keep_their_own_rules() -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    assert FastWordPiece.from_tokenizer(tok, 16) is None


def test_the_api_encoder_uses_the_fast_path() -> None:
    encode = shared_encoder(None, MAX_TOKENS)
    assert encode is not None
    assert getattr(encode, "__self__", None).__class__ is FastWordPiece
    assert encode("hello world") == [101, 7592, 2088, 102]
