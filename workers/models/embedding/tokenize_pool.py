"""Tokenizing a batch of texts in several processes, so a job keeps the GPU busy.

Sync inputs reach the worker as token ids (the API tier tokenized them). A job's items
reach it as text: the API takes a million-item upload at tens of thousands of items a
second and does not tokenize them. The model's own tokenizer spends about 250 us of CPU
on a 66-token paragraph on a GPU host (docs/bench/gpu-host.md), so a worker that
tokenized job items itself held a job to one core's worth of tokenizing: 13,000 items/s,
9% of what the GPU computes on such inputs.

Here each process runs the fast WordPiece path (core/models/wordpiece.py, about 27 us for
that paragraph; the tokenizer itself where the model's rules are not BERT's) and sends
back the batch's ids packed end to end, which the worker launches exactly as it does
token ids from the API tier (``EmbeddingModel._launch_packed``). Processes, not threads:
the fast path is Python and would hold the worker's interpreter lock. They are spawned,
not forked, because the worker has initialized CUDA.

How many: ``processes_for`` (pure) sizes the pool so it tokenizes at the GPU's measured
ceiling with room to spare, from two measurements the warm-up takes.

Which first: a batch's texts are handed over as the batch reaches the worker, and a
worker holds a dozen job batches from its schedulers at once. A batch of sync requests
is topped up with job items, whose texts need tokenizing; launched ahead of the job's
batches (decision 76), first come, first served it still waited for all their texts
before its own - the likeliest part of r18's 110-270 ms between a batch and its compute
beside a job (not yet measured on the GPU host). So the processes are given one chunk
each at a time, and the chunks waiting for them go earliest deadline first (``start``'s
``deadline``, the batch's). The price: a process waits a round trip for its next chunk
(about 0.1 ms, against 7-20 ms a chunk on a GPU host), which the executor's own queue
of one extra task hid.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import math
import multiprocessing
import signal
import threading
from array import array
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# The pool keeps this share of its cores busy at the GPU's ceiling: a busier pool
# would queue, and the GPU would wait on the tokenizer again.
UTILIZATION = 0.7
# Texts per task below which splitting costs more (a task's round trip, ~0.1 ms)
# than it saves.
MIN_CHUNK = 64

_encode: Callable[[str], list[int]] | None = None  # this pool process's encoder


def processes_for(ceiling_items_per_s: float, tokenize_s_per_item: float, cores: int) -> int:
    """Processes that tokenize ``ceiling_items_per_s`` at ``UTILIZATION``, each costing
    ``tokenize_s_per_item`` of one core an item; at least 1, at most ``cores``."""
    if ceiling_items_per_s <= 0 or tokenize_s_per_item <= 0:
        return 1
    need = ceiling_items_per_s * tokenize_s_per_item / UTILIZATION
    return max(1, min(max(1, cores), math.ceil(need)))


def usable_cores(affinity: int, cpu_max: str | None) -> int:
    """Cores this process may keep busy: its CPU affinity, capped by a cgroup v2 quota
    (``cpu.max``: "<quota> <period>" in µs, or "max <period>") where a container has
    one: ``os.sched_getaffinity`` counts the node's cores, not the container's share."""
    parts = (cpu_max or "").split()
    if len(parts) != 2 or parts[0] == "max":
        return max(1, affinity)
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return max(1, affinity)
    if quota <= 0 or period <= 0:
        return max(1, affinity)
    return max(1, min(affinity, math.ceil(quota / period)))


def host_cores() -> int:
    """``usable_cores`` of this process, read from the system."""
    import os

    try:
        cpu_max: str | None = Path("/sys/fs/cgroup/cpu.max").read_text()
    except OSError:
        cpu_max = None
    return usable_cores(len(os.sched_getaffinity(0)), cpu_max)


def make_encoder(model_dir: str, max_tokens: int) -> Callable[[str], list[int]]:
    """text -> [CLS] ... [SEP] ids: the fast path where the tokenizer's rules allow it."""
    from core.models.text_tokenizer import load_tokenizer
    from core.models.wordpiece import FastWordPiece

    tok = load_tokenizer(Path(model_dir), max_tokens)
    fast = FastWordPiece.from_tokenizer(tok, max_tokens)
    if fast is not None:
        return fast.encode
    return lambda text: list(tok.encode(text).ids)


def _start(model_dir: str, max_tokens: int) -> None:
    global _encode
    # A worker its scheduler spawned ignores SIGTERM, and an ignored signal stays ignored
    # across exec: the executor could not stop a process of a broken pool (it terminates
    # them), and the worker would wait for it at exit.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _encode = make_encoder(model_dir, max_tokens)


def _tokenize(texts: list[str]) -> tuple[bytes, bytes]:
    """In a pool process: every text's ids end to end, and each text's count (int32)."""
    assert _encode is not None, "the pool's initializer sets the encoder"
    flat, lens = array("i"), array("i")
    for text in texts:
        ids = _encode(text)
        flat.extend(ids)
        lens.append(len(ids))
    return flat.tobytes(), lens.tobytes()


class TokenizerPool:
    """``packed(texts)`` -> (ids end to end [int32], lengths [int32], starts [int64]):
    the arguments of the packed launch, tokenized in ``processes`` processes."""

    def __init__(self, model_dir: str, max_tokens: int, processes: int):
        if processes < 1:
            raise ValueError("a tokenizer pool needs at least one process")
        self.processes = processes
        self._pool = ProcessPoolExecutor(
            max_workers=processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start,
            initargs=(model_dir, max_tokens),
        )
        # Start every process now (each loads the tokenizer), not on the first batch.
        list(self._pool.map(_tokenize, [["warm"]] * processes))
        # Chunks not yet given to a process, most urgent first: (deadline, seq, texts,
        # the future its ids go to). Reentrant: a callback may run in the submitting
        # thread when its task is already done.
        self._lock = threading.RLock()
        self._waiting: list[tuple[float, int, list[str], Future[tuple[bytes, bytes]]]] = []
        self._seq = 0
        self._running = 0  # chunks handed to the executor, not yet done
        self._closed = False

    def packed(self, texts: Sequence[str]) -> tuple[Any, Any, Any]:
        return self.start(texts)()

    def start(
        self, texts: Sequence[str], deadline: float = math.inf
    ) -> Callable[[], tuple[Any, Any, Any]]:
        """Hand ``texts`` to the processes; the returned call waits for their ids (raising
        BrokenProcessPool if a process died meanwhile). ``deadline`` (epoch s, inf: none)
        orders the work waiting for a process: the earliest first, then the first come."""
        n = len(texts)
        parts = min(self.processes, max(1, n // MIN_CHUNK))
        step = max(1, -(-n // parts))
        outs: list[Future[tuple[bytes, bytes]]] = []
        with self._lock:
            if self._closed:
                raise RuntimeError("the tokenizer pool is closed")
            for i in range(0, n, step):
                out: Future[tuple[bytes, bytes]] = Future()
                self._seq += 1
                heapq.heappush(self._waiting, (deadline, self._seq, list(texts[i : i + step]), out))
                outs.append(out)
            self._feed()
        return lambda: _joined([f.result() for f in outs], n)

    def _feed(self) -> None:
        """Under the lock: the most urgent waiting chunks to the processes, one each. The
        executor's own queue is first come, first served, so it is given no more than its
        processes can start: a sync batch's texts arriving behind a job's thousands would
        otherwise wait for all of them."""
        while self._running < self.processes and self._waiting:
            _, _, texts, out = heapq.heappop(self._waiting)
            try:
                inner = self._pool.submit(_tokenize, texts)
            except Exception as exc:  # broken or shut down: the launch tokenizes instead
                out.set_exception(exc)
                continue
            self._running += 1
            inner.add_done_callback(partial(self._done, out=out))

    def _done(
        self, inner: Future[tuple[bytes, bytes]], *, out: Future[tuple[bytes, bytes]]
    ) -> None:
        with self._lock:
            self._running -= 1
            self._feed()
        if inner.cancelled():
            out.set_exception(RuntimeError("the tokenizer pool is closed"))
        elif (exc := inner.exception()) is not None:
            out.set_exception(exc)
        else:
            out.set_result(inner.result())

    def close(self) -> None:
        """Stop the processes now. A pool broken by a dead process may hold one that never
        finished starting, which the executor's exit handler would wait for forever (the
        worker, or a test run, then never exits): what is left is terminated. Its
        processes hold nothing but a tokenizer. (``_processes`` is the executor's own map;
        there is no public one.)"""
        with self._lock:
            self._closed = True
            waiting, self._waiting = self._waiting, []
        for *_, out in waiting:
            out.set_exception(RuntimeError("the tokenizer pool is closed"))
        procs = dict(getattr(self._pool, "_processes", None) or {})
        self._pool.shutdown(wait=False, cancel_futures=True)
        procs.update(getattr(self._pool, "_processes", None) or {})
        for proc in procs.values():
            with contextlib.suppress(OSError, ValueError):  # gone already, or closed
                proc.kill()


def _joined(got: list[tuple[bytes, bytes]], n: int) -> tuple[Any, Any, Any]:
    import numpy as np

    flat = np.frombuffer(b"".join(f for f, _ in got), dtype=np.int32)
    lens = np.frombuffer(b"".join(x for _, x in got), dtype=np.int32)
    starts = np.zeros(n, dtype=np.int64)
    if n > 1:
        np.cumsum(lens[:-1], out=starts[1:])
    return flat, lens, starts
