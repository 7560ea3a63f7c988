"""The causal LM on CPU: shipped weights, tokenizer, text that continues the prompt,
and continuous batching on the paged cache giving exactly the plain loop's tokens."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from scheduler.core.generation.config import PolicyConfig, kv_blocks_for_budget  # noqa: E402
from scheduler.core.generation.engine import Engine  # noqa: E402
from scheduler.core.generation.events import Finished  # noqa: E402
from scheduler.core.generation.policy import ContinuousBatcher  # noqa: E402
from scheduler.core.generation.sequence import GenRequest  # noqa: E402
from workers.models.causal_lm import weights  # noqa: E402
from workers.models.causal_lm.config import LMConfig  # noqa: E402
from workers.models.causal_lm.corpus import CORPUS_PATH  # noqa: E402
from workers.models.causal_lm.plain import generate  # noqa: E402
from workers.models.causal_lm.runner import ModelRunner  # noqa: E402
from workers.models.causal_lm.tokenizer import Codec  # noqa: E402

PROMPTS = [
    "Every accepted request is",
    "The scheduler",
    "When a worker dies,",
    "Job items",
    "PostgreSQL is also the request log",
    "A tenant that bursts",
]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.set_num_threads(2)
    return weights.load("cpu", torch.float32)


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec.load()


def run_batched(
    model: torch.nn.Module, codec: Codec, reqs: list[GenRequest], **cfg: int
) -> tuple[dict[str, Finished], ContinuousBatcher]:
    base = {"num_blocks": 256, "block_size": 16, "max_step_tokens": 256, "max_running": 32}
    base.update(cfg)
    pc = PolicyConfig(max_model_len=model.cfg.max_len, **base)
    policy = ContinuousBatcher(pc, codec.decode, codec.eos_id)
    engine = Engine(policy, ModelRunner(model, pc.num_blocks, pc.block_size))
    for r in reqs:
        assert engine.submit(r)
    done: dict[str, Finished] = {}
    while policy.has_work():
        done.update((e.seq_id, e) for e in engine.step() if isinstance(e, Finished))
    return done, policy


def test_weights_are_checked_against_the_manifest(tmp_path: Path) -> None:
    w, m = tmp_path / "weights.pt", tmp_path / "manifest.json"
    shutil.copy(weights.WEIGHTS_PATH, w)
    shutil.copy(weights.MANIFEST_PATH, m)
    assert weights.load(weights=w, manifest=m).cfg == LMConfig.from_dict(
        weights.manifest()["config"]
    )
    data = bytearray(w.read_bytes())
    data[len(data) // 2] ^= 0xFF
    w.write_bytes(bytes(data))
    with pytest.raises(weights.WeightsError, match="sha256"):
        weights.load(weights=w, manifest=m)


def test_shipped_weights_are_small_and_say_how_they_were_trained() -> None:
    assert weights.WEIGHTS_PATH.stat().st_size < 4 * 2**20
    record = weights.manifest()["training"]
    assert record["steps"] > 0 and record["corpus_tokens"] > 50_000


def test_tokenizer_round_trips_any_text(codec: Codec) -> None:
    text = "Gristmill: ünïcödé, emoji 🙂, tabs\tand\nnewlines — 1,000 req/s"
    assert codec.decode(codec.encode(text)) == text
    assert codec.vocab_size == LMConfig().vocab_size
    assert codec.eos_id not in codec.encode(text)


def test_greedy_text_continues_the_prompt_with_the_corpus_words(
    model: torch.nn.Module, codec: Codec
) -> None:
    vocab = set(re.findall(r"[a-z]+", CORPUS_PATH.read_text().lower()))
    for prompt in PROMPTS:
        out = generate(model, codec.encode(prompt), 40, eos_id=codec.eos_id)
        assert out == generate(model, codec.encode(prompt), 40, eos_id=codec.eos_id)
        words = re.findall(r"[a-z]+", codec.decode(out).lower())
        assert len(words) >= 5, (prompt, codec.decode(out))
        known = sum(w in vocab for w in words) / len(words)
        assert known >= 0.9, (prompt, codec.decode(out))  # words, not noise


def test_paged_step_gives_the_full_forward_logits(model: torch.nn.Module, codec: Codec) -> None:
    from core.generation import Chunk, SampleSpec, StepPlan

    ids = codec.encode("Every accepted request lands in Apache Kafka before it is acknowledged")
    full = model(torch.tensor([ids]))[0]
    runner = ModelRunner(model, num_blocks=8, block_size=4)
    # Two chunks into scattered blocks, then one decode token.
    blocks = (5, 2, 7, 0, 3, 6)
    cut = 9
    with torch.inference_mode():
        for start, toks in ((0, ids[:cut]), (cut, ids[cut:-1]), (len(ids) - 1, ids[-1:])):
            plan = StepPlan(1, (Chunk("x", tuple(toks), start, blocks, SampleSpec()),), 4)
            out = runner.execute(plan)
            assert out.sampled["x"] == int(full[start + len(toks) - 1].argmax())


def test_continuous_batching_gives_each_caller_the_plain_loops_tokens(
    model: torch.nn.Module, codec: Codec
) -> None:
    text = CORPUS_PATH.read_text()
    reqs = []
    for i in range(16):
        prompt = codec.encode(text[3000 * i : 3000 * i + 40 + 90 * (i % 5)])
        reqs.append(GenRequest(f"r{i}", tuple(prompt), 8 + 7 * (i % 6), ignore_eos=i % 2 == 0))
    # A small pool and budget: prompts are chunked and sequences preempted and resumed.
    done, policy = run_batched(model, codec, reqs, num_blocks=40, max_step_tokens=96)
    assert policy.preemptions > 0
    for r in reqs:
        eos = None if r.ignore_eos else codec.eos_id
        assert list(done[r.seq_id].token_ids) == generate(model, r.prompt, r.max_tokens, eos_id=eos)
        assert done[r.seq_id].text == codec.decode(done[r.seq_id].token_ids)


def test_sampling_is_reproducible_per_seed(model: torch.nn.Module, codec: Codec) -> None:
    prompt = tuple(codec.encode("The scheduler"))
    hot = [
        GenRequest(f"h{s}", prompt, 30, temperature=1.0, seed=s, ignore_eos=True) for s in (1, 1, 2)
    ]
    hot = [
        GenRequest(f"h{i}", h.prompt, 30, temperature=1.0, seed=h.seed, ignore_eos=True)
        for i, h in enumerate(hot)
    ]
    greedy = [GenRequest(f"g{i}", prompt, 30, ignore_eos=True) for i in range(3)]
    done, _ = run_batched(model, codec, hot + greedy)
    a, b, c = (list(done[f"h{i}"].token_ids) for i in range(3))
    assert a == b != c  # same seed, same text; another seed, another text
    assert a == generate(model, prompt, 30, temperature=1.0, seed=1)
    assert a != list(done["g0"].token_ids)


def test_kv_pool_is_sized_from_a_memory_budget(model: torch.nn.Module) -> None:
    per_token = model.cfg.kv_bytes_per_token(4)
    blocks = kv_blocks_for_budget(8 * 2**20, per_token, 16)
    runner = ModelRunner(model, blocks, 16)
    assert runner.pool.bytes <= 8 * 2**20 < runner.pool.bytes + 16 * per_token


def test_training_runs_and_its_weights_load(tmp_path: Path) -> None:
    from workers.models.causal_lm.train import train

    cfg = LMConfig(d_model=32, n_layer=1, n_head=2, d_ff=64, max_len=64)
    model, codec, record = train(cfg, steps=3, batch=2, ctx=32, lr=1e-3, threads=1, log_every=0)
    assert record["val_loss"] < 10 and record["steps"] == 3
    weights.save(model, record, tmp_path / "w.pt", tmp_path / "m.json")
    again = weights.load(weights=tmp_path / "w.pt", manifest=tmp_path / "m.json")
    ids = torch.tensor([codec.encode("The scheduler")])
    assert torch.allclose(model(ids), again(ids), atol=0.05)  # fp16 storage


def test_decoding_sequences_are_grouped_by_context_length() -> None:
    from workers.models.causal_lm.paged import _groups

    lens = [300, 17, 40, 33, 450, 16, 120, 90, 61]
    groups = _groups(lens)
    assert sorted(i for g in groups for i in g) == list(range(len(lens)))
    for g in groups:
        assert max(lens[i] for i in g) <= 2 * min(lens[i] for i in g)
    assert len(groups) == 4
