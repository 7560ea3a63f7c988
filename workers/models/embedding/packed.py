"""The packed path: a batch the API tier tokenized, planned, packed and enqueued at once.

Token ids packed end to end (``token_ids.decode_batch``) are sorted by length, planned
(``subbatch.plan`` over the captured CUDA graphs, the greedy cut otherwise), packed with
numpy into three pinned buffers and launched together; each sub-batch's rows are scattered
into input order on the GPU and one copy brings the batch back. ``launch`` only enqueues
(behind whatever batch the stream still runs); ``finish`` waits. On CPU ``launch``
computes the batch outright.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from workers.models import subbatch
from workers.models.base import Launched

if TYPE_CHECKING:
    from workers.models.embedding.runtime import EmbeddingModel


def pack_rows(
    flat: np.ndarray,
    lens: np.ndarray,
    starts: np.ndarray,
    rows: np.ndarray,
    seq: int,
    cap: int,
    out: np.ndarray,
) -> None:
    """Rows ``rows`` of a packed batch into ``out[:len(rows), :seq]``, zero padded.

    An input longer than ``cap`` keeps its first ``cap - 1`` ids and its last (the
    [SEP]), as the tokenizer's truncation does.
    """
    n_ids, st = lens[rows].astype(np.int64), starts[rows]
    keep = np.minimum(n_ids, cap)
    col = np.arange(seq, dtype=np.int64)[None, :]
    src = st[:, None] + col
    src = np.where(col == keep[:, None] - 1, (st + n_ids - 1)[:, None], src)
    mask = col < keep[:, None]
    np.clip(src, 0, max(0, flat.size - 1), out=src)
    view = out[: len(rows), :seq]
    view[...] = 0
    view[mask] = flat[src[mask]]


@dataclass
class PackedJob(Launched):
    """A packed batch enqueued on the GPU: ``host`` holds its rows once ``done`` fired."""

    host: torch.Tensor | None = None
    done: torch.cuda.Event | None = None
    events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = field(default_factory=list)
    t_start: float = 0.0

    def computing(self) -> bool:
        return self.done is not None


def launch(
    m: EmbeddingModel, flat: np.ndarray, lens: np.ndarray, starts: np.ndarray, normalize: bool
) -> PackedJob:
    """Plan, pack and enqueue a packed batch; on CPU compute it outright."""
    t_start = time.perf_counter()
    n = len(lens)
    out = np.empty((n, m.hidden), dtype=np.float32)
    if n == 0:
        return PackedJob(out, {"items": 0.0}, t_start=t_start)
    cap = m.spec.max_tokens
    keep = np.minimum(lens, cap)
    order = np.argsort(keep, kind="stable")
    sorted_lens = keep[order].tolist()
    if m.use_graphs:
        step = max(1, n // 64)
        parts = subbatch.plan(sorted_lens, m.seq_pad, m.graph_rows, m.graph_cost(), step)
    else:
        parts, a = [], 0
        for b in m.cut(sorted_lens):
            parts.append((a, b, b - a, m.seq_pad(sorted_lens[b - 1])))
            a = b
    stats = {
        "items": float(n),
        "chunks": float(len(parts)),
        "real_tokens": float(keep.sum()),
        "padded_tokens": float(sum(g * s for _, _, g, s in parts)),
        "plan_ms": (time.perf_counter() - t_start) * 1e3,
    }
    events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    with torch.inference_mode():
        if not m.cuda:
            for a, b, _, s in parts:
                rows = order[a:b]
                ids = torch.empty((b - a, s), dtype=torch.int32)
                pack_rows(flat, lens, starts, rows, s, cap, ids.numpy())
                lens_t = torch.from_numpy(keep[rows].astype(np.int32))
                pooled = m.encoder(ids, lens_t)
                pooled = F.normalize(pooled, dim=-1) if normalize else pooled
                out[rows] = pooled.numpy()
            return PackedJob(out, stats, t_start=t_start)
        # The whole batch in three pinned buffers and three copies (ids of every
        # sub-batch end to end, lengths and input positions in sorted order), so
        # each sub-batch costs only its replay and two device-side copies.
        sizes = [(b - a) * s for a, b, _, s in parts]
        ids_h = m.host_buffer((sum(sizes),), torch.int32)
        ids_np, off = ids_h.numpy(), 0
        for (a, b, _, s), size in zip(parts, sizes, strict=True):
            view = ids_np[off : off + size].reshape(b - a, s)
            pack_rows(flat, lens, starts, order[a:b], s, cap, view)
            off += size
        lens_h = m.host_buffer((n,), torch.int32)
        lens_h.numpy()[:] = keep[order]
        pos_h = m.host_buffer((n,), torch.int64)
        pos_h.numpy()[:] = order
        ids_d = ids_h.to(m.device, non_blocking=True)
        lens_d = lens_h.to(m.device, non_blocking=True)
        pos_d = pos_h.to(m.device, non_blocking=True)
        dev = torch.empty((n, m.hidden), dtype=torch.float32, device=m.device)
        off = 0
        for (a, b, g, s), size in zip(parts, sizes, strict=True):
            r = b - a
            ids_part = ids_d[off : off + size].view(r, s)
            off += size
            t0 = torch.cuda.Event(enable_timing=True) if m.timing else None
            if t0 is not None:
                t0.record()
            if m.use_graphs:
                gr = m.graph(g, s)
                gr.ids[:r].copy_(ids_part)
                gr.lens[:r].copy_(lens_d[a:b])
                gr.graph.replay()
                pooled = gr.normed[:r] if normalize else gr.out[:r]
            else:
                pooled = m.encoder(ids_part, lens_d[a:b])
                pooled = F.normalize(pooled, dim=-1) if normalize else pooled
            dev.index_copy_(0, pos_d[a:b], pooled)
            if t0 is not None:
                t1 = torch.cuda.Event(enable_timing=True)
                t1.record()
                events.append((t0, t1))
        stats["launch_ms"] = (time.perf_counter() - t_start) * 1e3
        host = m.host_buffer((n, m.hidden), torch.float32)
        host.copy_(dev, non_blocking=True)
        done = torch.cuda.Event(enable_timing=m.timing)
        done.record()
    # Host clock marks (perf_counter, one clock for every process of the machine):
    # a benchmark sees whether a batch was enqueued before the one ahead of it ended.
    stats["t_launch"], stats["t_enqueued"] = t_start, time.perf_counter()
    return PackedJob(None, stats, host=host, done=done, events=events, t_start=t_start)


def finish(m: EmbeddingModel, job: PackedJob) -> np.ndarray:
    stats = job.stats if job.stats is not None else {}
    if job.done is not None:
        job.done.synchronize()
        stats["t_done"] = time.perf_counter()
        assert job.host is not None
        # A view of the pinned buffer (it stays alive with the array): no extra copy.
        job.outputs = job.host.numpy()
        if job.events:
            stats["gpu_ms"] = sum(x.elapsed_time(y) for x, y in job.events)
            stats["gpu_span_ms"] = job.events[0][0].elapsed_time(job.done)
        job.done = job.host = None
        job.events = []
    stats["wall_ms"] = (time.perf_counter() - job.t_start) * 1e3
    m.last_stats = stats
    assert isinstance(job.outputs, np.ndarray)
    return job.outputs
