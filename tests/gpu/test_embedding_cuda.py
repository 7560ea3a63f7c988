"""The embedding model on CUDA agrees with the CPU reference (run on the device machine).

GRISTMILL_EMBED_MODEL_DIR=.modelcache/all-minilm-l6-v2 python -m pytest tests/gpu -q
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

from core.models.embedding import EmbedSpec  # noqa: E402


def _model(device: str, **kw: Any) -> Any:
    from core.config import load_settings
    from workers.models.embedding.runtime import EmbeddingModel, EmbedRuntime

    # GRISTMILL_EMBED_MODEL_DIR: the weights carried to the GPU machine.
    model_dir = load_settings().embed_model_dir
    spec = EmbedSpec(
        name="all-minilm-l6-v2", version="1", max_batch_size=512, tokenizer_dir=model_dir
    )
    return EmbeddingModel(spec, EmbedRuntime(device=device, model_dir=model_dir, **kw))


@pytest.fixture(scope="module")
def models() -> tuple[Any, Any]:
    return _model("cuda"), _model("cpu")


@pytest.fixture(scope="module")
def texts(models: tuple[Any, Any]) -> list[str]:
    from workers.models.embedding.warmup import synthetic_texts

    gpu, _ = models
    return [
        *synthetic_texts(gpu.tokenizer, 200, 3, 300, seed=5),
        "A man is eating food.",
        "Hi",
        "x " * 400,
    ]


def test_cuda_matches_cpu_within_fp16_tolerance(models: tuple[Any, Any], texts: list[str]) -> None:
    gpu, cpu = models
    assert gpu.dtype == torch.float16
    a = torch.tensor(gpu.predict(texts, {"normalize": True}))
    b = torch.tensor(cpu.predict(texts, {"normalize": True}))
    assert a.shape == (len(texts), 384)
    assert (a - b).abs().max().item() < 5e-3
    assert (a * b).sum(-1).min().item() > 0.9995
    raw = torch.tensor(gpu.predict(texts[:20], {"normalize": False}))
    ref = torch.tensor(cpu.predict(texts[:20], {"normalize": False}))
    assert torch.allclose(raw, ref, rtol=1e-2, atol=1e-2)


def test_graphs_buckets_and_order_agree(models: tuple[Any, Any], texts: list[str]) -> None:
    gpu, _ = models
    base = torch.tensor(gpu.embed(texts))
    assert gpu.last_stats["chunks"] >= 1
    variants = [
        dict(use_graphs=False),
        dict(bucket_tokens=10**9),
        dict(pipeline=False),
        dict(pin=False),
        dict(bucket_tokens=512),
        dict(first_unit_items=7, unit_items=50),
    ]
    for attrs in variants:
        saved = {k: getattr(gpu, k) for k in attrs}
        try:
            for k, v in attrs.items():
                setattr(gpu, k, v)
            got = torch.tensor(gpu.embed(texts))
        finally:
            for k, v in saved.items():
                setattr(gpu, k, v)
        assert (got - base).abs().max().item() < 2e-3, attrs
    one_by_one = torch.tensor([gpu.embed([t])[0] for t in texts[:16]])
    assert (one_by_one - base[:16]).abs().max().item() < 2e-3


def test_pretokenized_path_matches_text_path(models: tuple[Any, Any], texts: list[str]) -> None:
    gpu, _ = models
    ids = [e.ids for e in gpu.tokenizer.encode_batch(texts)]
    a = torch.tensor(gpu.embed_ids(ids))
    b = torch.tensor(gpu.embed(texts))
    assert (a - b).abs().max().item() < 2e-3
    assert (torch.from_numpy(gpu.embed_array(texts)) - b).abs().max().item() < 2e-3
    assert (torch.from_numpy(gpu.embed_ids_array(ids)) - b).abs().max().item() < 2e-3


def test_warmup_profile_and_memory() -> None:
    m = _model("cuda")
    profile = m.warmup()
    assert set(profile) >= {1, 512} and all(v > 0 for v in profile.values())
    assert set(m.peak_memory_bytes) == set(profile)
    assert m.max_batch_for_memory(2**40) == 512
    assert m.max_batch_for_memory(0) == 0
    assert m.graphs is not None and m.graphs.captured  # small shapes are captured up front
    m.close()


def test_tokenized_inputs_take_the_packed_path(models: tuple[Any, Any], texts: list[str]) -> None:
    """What the API tier sends (token ids) gives what the text gives, on graphs and off."""
    gpu, cpu = models
    tokenized = [gpu.spec.message_input(t) for t in texts]
    assert all(isinstance(x, dict) for x in tokenized)
    want = torch.from_numpy(cpu.predict(texts, {"normalize": True}))
    for graphs in (True, False):
        gpu.use_graphs = graphs
        try:
            got = torch.from_numpy(gpu.predict(tokenized, {"normalize": True}).copy())
        finally:
            gpu.use_graphs = True
        assert got.shape == want.shape
        assert (got - want).abs().max().item() < 5e-3
        assert gpu.last_stats["padded_tokens"] >= gpu.last_stats["real_tokens"]
    gpu.capture_graphs()
    gpu.measure_graphs()
    assert gpu.graph_ms and all(ms > 0 for ms in gpu.graph_ms.values())


def test_launched_back_to_back_batches_match_one_at_a_time(
    models: tuple[Any, Any], texts: list[str]
) -> None:
    """The worker launches a batch while the one before it still computes (token ids
    in, as the scheduler sends them): each result equals that batch run alone."""
    from core.models.token_ids import encode_ids

    gpu, _ = models
    ids = [encode_ids(e.ids) for e in gpu.encode_texts(texts)]
    a, b = ids[:150], ids[150:]
    alone_a = gpu.predict([{"ids": x} for x in a], {"normalize": True}).copy()
    alone_b = gpu.predict([{"ids": x} for x in b], {"normalize": True}).copy()
    ja = gpu.launch(a, {"normalize": True}, token_ids=True)
    jb = gpu.launch(b, {"normalize": True}, token_ids=True)
    out_b = gpu.finish(jb)  # out of order on purpose: b waits for a on the stream
    out_a = gpu.finish(ja)
    assert abs(out_a - alone_a).max() < 1e-6
    assert abs(out_b - alone_b).max() < 1e-6
