"""Warm-up of the embedding model: the cost curve and the memory each batch size needs.

The worker reports the curve to its scheduler (ms per batch by batch size: the cost
model's seed) and bounds its batch size by the GPU memory measured here.
"""

from __future__ import annotations

import logging
import random
import statistics
import time
from typing import TYPE_CHECKING, Any

import torch
from tokenizers import Tokenizer

from core.models.token_ids import decode_batch, encode_ids, tokenized_input
from workers.models.base import memory_batch_limit
from workers.models.embedding.tokenize_pool import host_cores, make_encoder, processes_for

if TYPE_CHECKING:
    from workers.models.embedding.runtime import EmbeddingModel

log = logging.getLogger(__name__)

# CPU: timed runs per batch size (the fastest is kept) and the time they may take in all.
# Three runs take ~2.5 s for sizes 1..32 on the 2-core box; sizes past the budget are
# extrapolated, then measured on real batches (scheduler/core/costmodel.py).
CPU_REPEATS = 3
CPU_BUDGET_S = 3.0


def synthetic_texts(tok: Tokenizer, n: int, lo: int, hi: int, seed: int = 0) -> list[str]:
    """``n`` texts of whole vocabulary words, ``lo``..``hi`` tokens each ([CLS]/[SEP] included).

    Each word is a single token, so lengths are exact; used by warmup and the benchmarks.
    """
    words = sorted(w for w in tok.get_vocab() if w.isascii() and w.isalpha() and len(w) >= 3)
    rnd = random.Random(seed)
    return [" ".join(rnd.choices(words, k=rnd.randint(lo, hi) - 2)) for _ in range(n)]


def warmup(model: EmbeddingModel) -> dict[int, float]:
    """The cost curve (``cost_curve``), then the tokenizer pool sized from it."""
    profile = cost_curve(model)
    hi = min(128, model.spec.max_tokens)
    texts = synthetic_texts(model.tokenizer, 2048, min(8, hi), hi, seed=3)
    model.start_tokenizers(tokenizer_processes(model, profile, texts))
    return profile


def tokenizer_processes(model: EmbeddingModel, profile: dict[int, float], texts: list[str]) -> int:
    """The runtime's count if it names one; else, on a GPU, enough processes to tokenize
    at the ceiling the curve shows (its fastest items/s) at the fast path's cost measured
    here on ``texts``; on a CPU none (the forward, not the tokenizer, is the bottleneck)."""
    if model.tokenize_processes >= 0:
        return model.tokenize_processes
    if not model.cuda or not profile:
        return 0
    ceiling = max(n / (ms / 1e3) for n, ms in profile.items() if ms > 0)
    encode = make_encoder(str(model.model_dir), model.spec.max_tokens)
    for t in texts:  # the first pass learns the words (a corpus repeats its words)
        encode(t)
    t0 = time.perf_counter()
    for t in texts:
        encode(t)
    cost = (time.perf_counter() - t0) / len(texts)
    gpus = max(1, torch.cuda.device_count())
    cores = host_cores() // gpus - 1  # this worker's share, less its own core
    n = processes_for(ceiling, cost, cores)
    log.info(
        "tokenizer pool: %d process(es) for %.0f items/s at %.1f us an item", n, ceiling, cost * 1e6
    )
    return n


def cost_curve(model: EmbeddingModel) -> dict[int, float]:
    """ms per batch by batch size on representative (8..128 token) texts.

    CUDA: captures every graph shape, then times each power of two up to
    max_batch_size and measures the peak GPU memory per batch size with every input
    at max_tokens. CPU: small sizes within a ~1.5 s budget, then max_batch_size
    extrapolated linearly (the cost model interpolates between points and is flat
    past the last one).
    """
    mb = model.spec.max_batch_size
    sizes = sorted({*(1 << i for i in range(mb.bit_length()) if (1 << i) <= mb), mb})
    hi = min(128, model.spec.max_tokens)
    texts = synthetic_texts(model.tokenizer, mb, min(8, hi), hi, seed=1)
    # Time what the worker will be sent: ids from the API tier when it tokenizes.
    inputs: list[Any] = list(texts)
    if model.spec.tokenize_in_api:
        inputs = [
            tokenized_input(t, e.ids)
            for t, e in zip(texts, model.encode_texts(texts), strict=False)
        ]
    params = {"normalize": True}
    profile: dict[int, float] = {}
    if model.cuda:
        model.capture_graphs()
        model.measure_graphs()
        for n in sizes:
            batch = inputs[:n]
            model.predict(batch, params)
            runs = []
            for _ in range(5):
                t0 = time.perf_counter()
                model.predict(batch, params)
                runs.append((time.perf_counter() - t0) * 1e3)
            profile[n] = statistics.median(runs)
        model.profile_measured = list(sizes)
        measure_memory(model, sizes)
        free, _ = torch.cuda.mem_get_info(model.device)
        # Memory this process reserved but does not use is free to it too.
        free += torch.cuda.memory_reserved(model.device) - torch.cuda.memory_allocated(model.device)
        model.memory_batch_limit = memory_batch_limit(
            model.peak_memory_bytes, model.graph_memory_bytes, free, mb
        )
        return {n: ms for n, ms in profile.items() if n <= model.batch_limit()}
    # CPU: each size is timed CPU_REPEATS times and its fastest run kept: the warm-up runs
    # while other processes start on the same cores, and a run slowed by them says
    # nothing about the model (the scheduler replaces these provisional readings with
    # medians of real batches, and probes larger sizes: scheduler/core/costmodel.py).
    model.predict(inputs[:1], params)  # the process's first call pays for lazy setup
    budget_end = time.perf_counter() + CPU_BUDGET_S
    measured: list[int] = []
    for n in sizes:
        runs = []
        for _ in range(CPU_REPEATS):
            t0 = time.perf_counter()
            model.predict(inputs[:n], params)
            runs.append((time.perf_counter() - t0) * 1e3)
        ms = min(runs)
        profile[n] = ms
        measured.append(n)
        # Stop before a doubling would overrun the budget.
        if time.perf_counter() + 2.2 * CPU_REPEATS * ms / 1e3 > budget_end:
            break
    model.profile_measured = measured
    if measured[-1] != mb:
        if len(measured) >= 2:
            n0, n1 = measured[-2], measured[-1]
            slope = (profile[n1] - profile[n0]) / (n1 - n0)
        else:
            slope = profile[measured[-1]] / measured[-1]
        profile[mb] = profile[measured[-1]] + max(0.0, slope) * (mb - measured[-1])
    return profile


def measure_memory(model: EmbeddingModel, sizes: list[int]) -> None:
    """Peak GPU memory per batch size, every input at max_tokens, above the weights.

    Measured eagerly (the activations a batch needs), plus the graphs' memory, which
    stays reserved. Sub-batches hold at most ``bucket_tokens`` padded tokens, so the
    peak stops growing once a batch fills one sub-batch.
    """
    longest = synthetic_texts(
        model.tokenizer, max(sizes), model.spec.max_tokens, model.spec.max_tokens, seed=2
    )
    flat, lens, starts = decode_batch(
        [encode_ids(e.ids) for e in model.encode_texts(longest)]  # the packed path's inputs
    )
    graphs, model.use_graphs = model.use_graphs, False
    try:
        torch.cuda.synchronize(model.device)
        base = torch.cuda.memory_allocated(model.device)
        for n in sizes:
            torch.cuda.reset_peak_memory_stats(model.device)
            model.embed(longest[:n])
            model.embed_packed(flat[: int(lens[:n].sum())], lens[:n], starts[:n])
            torch.cuda.synchronize(model.device)
            model.peak_memory_bytes[n] = (
                torch.cuda.max_memory_allocated(model.device) - base + model.graph_memory_bytes
            )
    finally:
        model.use_graphs = graphs
