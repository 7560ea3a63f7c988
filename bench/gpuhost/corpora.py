"""The inputs of the whole-system run and the model's own answers for them, made on the
GPU by the worker's model code before any service starts, and the raw ceiling."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from bench import corpus

MODEL = "all-minilm-l6-v2"
MAX_BATCH = 1024  # the GPU benchmarks' batch: the cost curve's best items/s on a GPU
JOB_SAMPLE = 2000  # job answers checked against the model's own vectors


def build_corpora(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Short sentences for sync traffic (with the model's vectors), the job's texts (with
    vectors for a sample), and the raw ceiling for the job's lengths: all computed here
    by the model itself on the GPU before any service starts."""
    import numpy as np
    import torch

    from core.config import load_settings
    from core.vocab import ModelRef
    from workers.models.loader import load_models

    settings = load_settings()
    model_dir = Path(settings.embed_model_dir)
    words = corpus.vocabulary_words(model_dir / "vocab.txt")
    model = load_models(settings, [MODEL])[ModelRef(MODEL, "1")]
    out: dict[str, Any] = {}
    t0 = time.time()
    short = corpus.sentences(words, corpus.short_lengths(args.sync_texts, seed=1), seed=2)
    corpus.write(work / "short", short, model.embed_array(short))  # type: ignore[attr-defined]
    lengths = corpus.mixed_lengths(args.job_items, 8, 256, seed=3)
    job = corpus.sentences(words, lengths, seed=4)
    rng = random.Random(5)
    sample = sorted(rng.sample(range(len(job)), min(JOB_SAMPLE, len(job))))
    vectors = model.embed_array([job[i] for i in sample])  # type: ignore[attr-defined]
    with open(work / "job.jsonl", "wb") as f:
        f.write(b"".join(json.dumps({"input": t}).encode() + b"\n" for t in job))
    np.save(work / "job.sample.npy", np.asarray(sample, dtype=np.int64))
    np.save(work / "job.vectors.npy", vectors)
    out["corpora_s"] = round(time.time() - t0, 1)
    out["ceiling"] = raw_ceiling(model, job, rng, args.ceiling_items)
    model.close()
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def raw_ceiling(model: Any, texts: list[str], rng: random.Random, n: int) -> dict[str, Any]:
    """The encoder alone on token ids already on the GPU, batches of MAX_BATCH sorted by
    length (the least padding any batching can reach): items/s for these inputs."""
    import torch

    pick = rng.sample(texts, min(n, len(texts)))
    ids = [e.ids for e in model.tokenizer.encode_batch(pick)]
    ids.sort(key=len)
    dev = model.device
    encoder = model.encoder  # the worker's own encoder and weights
    batches = []
    for i in range(0, len(ids), MAX_BATCH):
        chunk = ids[i : i + MAX_BATCH]
        width = max(map(len, chunk))
        t = torch.zeros((len(chunk), width), dtype=torch.int32)
        for r, row in enumerate(chunk):
            t[r, : len(row)] = torch.tensor(row, dtype=torch.int32)
        lens = torch.tensor([len(r) for r in chunk], dtype=torch.int32)
        batches.append((t.to(dev), lens.to(dev)))
    cuda = dev.type == "cuda"
    with torch.inference_mode():
        for b in batches:  # every shape once first: first runs of a shape cost more
            encoder(*b)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for b in batches:
            encoder(*b)
        if cuda:
            torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    return {
        "items": len(ids),
        "mean_tokens": round(statistics.mean(map(len, ids)), 1),
        "batch": MAX_BATCH,
        "ms": round(ms, 1),
        "items_per_s": round(len(ids) / ms * 1e3),
    }
