"""Texts to send and the model's own vectors for them, so every answer can be checked.

A corpus is two files side by side: ``<name>.texts.jsonl`` (one JSON string a line) and
``<name>.vectors.npy`` (float32, one normalized row per text, computed by the model
itself in the benchmark's own process, before the run). A load generator sends text
``j mod n`` as request ``j`` and compares the answer's vector with row ``j mod n``:
the cosine must be at least ``MIN_COSINE``. Batches of other shapes round fp16
differently (1e-4 at most, docs/bench/gpu.md), another text's vector is nowhere near.

Texts are sentences of whole words from the model's own vocabulary, so their length in
tokens is about their length in words; ``mixed_lengths`` draws lengths the way real
corpora spread them (most short, a long tail), ``short`` the length of a search query.
"""

from __future__ import annotations

import base64
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

MIN_COSINE = 0.999


def vocabulary_words(vocab_txt: Path) -> list[str]:
    """Whole lowercase words of a WordPiece vocabulary (no ##pieces, no [special])."""
    words = []
    for line in vocab_txt.read_text(encoding="utf-8").splitlines():
        if line.isascii() and line.isalpha() and line.islower() and len(line) >= 3:
            words.append(line)
    return words


def sentences(words: Sequence[str], lengths: Sequence[int], seed: int) -> list[str]:
    """One sentence of ``n`` words for each ``n``; every sentence differs (the index ends it)."""
    rng = random.Random(seed)
    out = []
    for i, n in enumerate(lengths):
        body = " ".join(rng.choices(words, k=max(1, n - 3)))
        out.append(f"{body} {i}")
    return out


def mixed_lengths(n: int, lo: int, hi: int, seed: int, median: float = 48.0) -> list[int]:
    """Log-normal lengths clipped to ``lo..hi``: the shape of paragraphs in a real corpus."""
    rng = random.Random(seed)
    mu, sigma = math.log(median), 0.8
    return [min(hi, max(lo, round(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


def short_lengths(n: int, seed: int, lo: int = 6, hi: int = 16) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(lo, hi) for _ in range(n)]


def write(base: Path, texts: Sequence[str], vectors: Any) -> None:
    import numpy as np

    base.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{base}.texts.jsonl", "wb") as f:
        f.write(b"".join(orjson.dumps(t) + b"\n" for t in texts))
    np.save(f"{base}.vectors.npy", np.ascontiguousarray(vectors, dtype=np.float32))


def read_texts(base: str | Path) -> list[str]:
    with open(f"{base}.texts.jsonl", "rb") as f:
        return [orjson.loads(line) for line in f]


def read_vectors(base: str | Path) -> Any:
    import numpy as np

    return np.load(f"{base}.vectors.npy", mmap_mode="r")


def answer_vector(body: dict[str, Any], wire: str) -> Any:
    """The vector in an answer: /v1/infer's ``output``, or OpenAI's base64 ``embedding``."""
    import numpy as np

    if wire == "embeddings":
        emb = body["data"][0]["embedding"]
        if isinstance(emb, str):
            return np.frombuffer(base64.b64decode(emb), dtype="<f4")
        return np.asarray(emb, dtype=np.float32)
    return np.asarray(body["output"], dtype=np.float32)


def cosine(a: Any, b: Any) -> float:
    import numpy as np

    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return float(np.dot(a, b) / (na * nb)) if na and nb else 0.0


class VectorCheck:
    """A load generator's view of a corpus: what request j sends and whether its answer
    is the model's vector for it."""

    def __init__(self, base: str, model: str, wire: str) -> None:
        self.texts = read_texts(base)
        self.vectors = read_vectors(base)
        self.model = model
        self.wire = wire

    def text(self, j: int) -> str:
        return self.texts[j % len(self.texts)]

    def body(self, text: str) -> dict[str, Any]:
        if self.wire == "embeddings":
            return {"model": self.model, "input": text, "encoding_format": "base64"}
        return {"model": self.model, "input": text}

    def right(self, j: int, body: dict[str, Any]) -> bool:
        try:
            got = answer_vector(body, self.wire)
        except (KeyError, IndexError, TypeError, ValueError):
            return False
        ref = self.vectors[j % len(self.texts)]
        return got.shape == ref.shape and cosine(got, ref) >= MIN_COSINE
