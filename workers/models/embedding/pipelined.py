"""The text pipeline: plain texts tokenized in units while the GPU runs the unit before.

A batch is sorted by length (characters, then exact tokens inside each tokenizer unit)
and cut into sub-batches of about ``bucket_tokens`` padded tokens. On CUDA a helper
thread tokenizes unit k+1 (the Rust tokenizer releases the GIL) while the main thread
replays unit k's sub-batches and turns finished embeddings into lists; host buffers are
pinned so the copies are asynchronous. On CPU the same code runs inline.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from core.models.token_ids import decode_ids, is_tokenized

if TYPE_CHECKING:
    from workers.models.embedding.runtime import EmbeddingModel

Encode = Callable[[list[int]], list[Sequence[int]]]


@dataclass
class Prepared:
    """One tokenized sub-batch, padded to a common length, in host memory (pinned on CUDA)."""

    positions: list[int]  # where each row goes in the caller's batch
    ids: torch.Tensor  # [rows, s_pad] int32
    lens: torch.Tensor  # [rows] int32
    real_tokens: int
    prep_s: float  # time to tokenize and pack the unit (on its first sub-batch)


@dataclass
class SubBatch:
    positions: list[int]
    host: torch.Tensor  # [rows, hidden] fp32, valid once ``done`` has fired
    done: torch.cuda.Event | None
    start: torch.cuda.Event | None
    padded_tokens: int  # what the GPU computed, graph row padding included


def tokenize_texts(m: EmbeddingModel, texts: Sequence[str]) -> Encode:
    def encode(unit: list[int]) -> list[Sequence[int]]:
        return [e.ids for e in m.encode_texts([texts[i] for i in unit])]

    return encode


def take_ids(m: EmbeddingModel, ids: Sequence[Sequence[int]]) -> Encode:
    cap = m.spec.max_tokens

    def take(unit: list[int]) -> list[Sequence[int]]:
        # Keep the final [SEP] when truncating, as the tokenizer does.
        return [ids[i] if len(ids[i]) <= cap else [*ids[i][: cap - 1], ids[i][-1]] for i in unit]

    return take


def encode_inputs(m: EmbeddingModel, inputs: Sequence[Any]) -> Encode:
    """Texts through the tokenizer, already tokenized inputs through ``take_ids``."""
    cap = m.spec.max_tokens

    def encode(unit: list[int]) -> list[Sequence[int]]:
        texts = [i for i in unit if not is_tokenized(inputs[i])]
        got = dict(
            zip(texts, (e.ids for e in m.encode_texts([inputs[i] for i in texts])), strict=True)
        )
        out: list[Sequence[int]] = []
        for i in unit:
            if i in got:
                out.append(got[i])
            else:
                ids = decode_ids(inputs[i]["ids"])
                out.append(ids if len(ids) <= cap else [*ids[: cap - 1], ids[-1]])
        return out

    return encode


def prepare_unit(m: EmbeddingModel, unit: list[int], encode: Encode) -> list[Prepared]:
    """Tokenize one unit, sort it by exact length, cut it into padded sub-batches."""
    t0 = time.perf_counter()
    seqs = encode(unit)
    lens = [len(x) for x in seqs]
    by_len = sorted(range(len(unit)), key=lens.__getitem__)
    out: list[Prepared] = []
    a = 0
    for b in m.cut([lens[i] for i in by_len]):
        rows = by_len[a:b]
        out.append(pack(m, [unit[i] for i in rows], [seqs[i] for i in rows]))
        a = b
    out[0].prep_s = time.perf_counter() - t0
    return out


def pack(m: EmbeddingModel, positions: list[int], seqs: list[Sequence[int]]) -> Prepared:
    rows = len(seqs)
    lens = np.fromiter(map(len, seqs), dtype=np.int32, count=rows)
    total = int(lens.sum())
    s = m.seq_pad(int(lens.max()))
    ids_t, lens_t = m.host_buffer((rows, s), torch.int32), m.host_buffer((rows,), torch.int32)
    ids_np = ids_t.numpy()
    ids_np.fill(0)  # [PAD]
    flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int32, count=total)
    ids_np[np.arange(s)[None, :] < lens[:, None]] = flat  # row-major fill
    lens_t.numpy()[:] = lens
    return Prepared(positions, ids_t, lens_t, total, 0.0)


def launch_sub(m: EmbeddingModel, p: Prepared, normalize: bool) -> SubBatch:
    if not m.cuda:
        pooled = m.encoder(p.ids, p.lens)
        pooled = F.normalize(pooled, dim=-1) if normalize else pooled
        return SubBatch(p.positions, pooled, None, None, p.ids.numel())
    start = torch.cuda.Event(enable_timing=True) if m.timing else None
    if start is not None:
        start.record()
    rows, s = p.ids.shape
    host = m.host_buffer((rows, m.hidden), torch.float32)
    padded = p.ids.numel()
    if m.use_graphs:
        padded = 0
        # One replay per slice of at most the bucket's rows; rows past ``r`` in the
        # static inputs hold an earlier call's (valid) values and their output is dropped.
        ladder = m.graph_rows(s)
        for r0 in range(0, rows, ladder[-1]):
            r1 = min(rows, r0 + ladder[-1])
            r = r1 - r0
            g = m.graph(next(b for b in ladder if b >= r), s)
            padded += g.ids.numel()
            g.ids[:r].copy_(p.ids[r0:r1], non_blocking=True)
            g.lens[:r].copy_(p.lens[r0:r1], non_blocking=True)
            g.graph.replay()
            pooled = g.normed[:r] if normalize else g.out[:r]
            host[r0:r1].copy_(pooled, non_blocking=True)
    else:
        ids = p.ids.to(m.device, non_blocking=True)
        lens = p.lens.to(m.device, non_blocking=True)
        pooled = m.encoder(ids, lens)
        pooled = F.normalize(pooled, dim=-1) if normalize else pooled
        host.copy_(pooled, non_blocking=True)
    done = torch.cuda.Event(enable_timing=m.timing)
    done.record()
    return SubBatch(p.positions, host, done, start, padded)


def run(
    m: EmbeddingModel,
    keys: list[int],
    encode: Encode,
    normalize: bool,
    array: np.ndarray | None = None,
) -> list[list[float]]:
    """Sort by length, tokenize in units (unit k+1 in the helper thread while unit k
    runs), and fill ``array`` or a list of lists in input order."""
    t_start = time.perf_counter()
    n = len(keys)
    out: list[list[float]] = [] if array is not None else [[] for _ in range(n)]
    if n == 0:
        return out
    order = sorted(range(n), key=keys.__getitem__)  # chars: a cheap proxy for tokens
    first = min(n, m.first_unit_items)
    units = [order[:first]] + [order[i : i + m.unit_items] for i in range(first, n, m.unit_items)]
    stats = {
        "items": float(n),
        "chunks": 0.0,
        "real_tokens": 0.0,
        "padded_tokens": 0.0,
        "prep_ms": 0.0,
        "prep_wait_ms": 0.0,
        "wait_ms": 0.0,
        "tolist_ms": 0.0,
    }
    gpu_pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def collect(job: SubBatch) -> None:
        t0 = time.perf_counter()
        if job.done is not None:
            job.done.synchronize()
            if job.start is not None:
                gpu_pairs.append((job.start, job.done))
        t1 = time.perf_counter()
        if array is not None:
            array[job.positions] = job.host.numpy()
        else:
            for pos, row in zip(job.positions, job.host.tolist(), strict=True):
                out[pos] = row
        stats["wait_ms"] += (t1 - t0) * 1e3
        stats["tolist_ms"] += (time.perf_counter() - t1) * 1e3

    with torch.inference_mode():
        # The first unit is prepared inline: nothing runs yet that it could overlap.
        fut: Future[list[Prepared]] | list[Prepared] = prepare_unit(m, units[0], encode)
        pending: SubBatch | None = None
        for u in range(len(units)):
            t0 = time.perf_counter()
            preps = fut.result() if isinstance(fut, Future) else fut
            stats["prep_wait_ms"] += (time.perf_counter() - t0) * 1e3
            if u + 1 < len(units):
                pool = m.prep_pool if m.pipeline else None
                fut = (
                    pool.submit(prepare_unit, m, units[u + 1], encode)
                    if pool is not None
                    else prepare_unit(m, units[u + 1], encode)
                )
            for p in preps:
                job = launch_sub(m, p, normalize)
                stats["chunks"] += 1
                stats["real_tokens"] += p.real_tokens
                stats["padded_tokens"] += job.padded_tokens
                stats["prep_ms"] += p.prep_s * 1e3
                if pending is not None:  # lists for k-1 while the GPU works on k
                    collect(pending)
                pending = job
        if pending is not None:
            collect(pending)
    stats["wall_ms"] = (time.perf_counter() - t_start) * 1e3
    if gpu_pairs:
        stats["gpu_ms"] = sum(s.elapsed_time(e) for s, e in gpu_pairs)
        stats["gpu_span_ms"] = gpu_pairs[0][0].elapsed_time(gpu_pairs[-1][1])
    m.last_stats = stats
    return out
