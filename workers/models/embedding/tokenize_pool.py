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
ceiling with room to spare, from two measurements the warm-up takes. The warm-up's cost
a text is a quiet host's; beside a running job the same work took several times as long
(r16, r17: 5 processes sized at 38 µs a text held the worker's launch 30% of the time).
So the pool keeps measuring what a text costs its processes, and while the launch waits
for its ids it grows to the size that cost calls for (``grown_size``, pure).
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import signal
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# The pool keeps this share of its cores busy at the GPU's ceiling: a busier pool
# would queue, and the GPU would wait on the tokenizer again.
UTILIZATION = 0.7
# Texts per task below which splitting costs more (a task's round trip, ~0.1 ms)
# than it saves.
MIN_CHUNK = 64
# The pool grows only while the worker's launch waited for its ids at least this share
# of the time (below it the pool is not what the GPU waits on), judged over a window.
WAIT_SHARE = 0.1
RESIZE_EVERY_S = 10.0

_encode: Callable[[str], list[int]] | None = None  # this pool process's encoder


def processes_for(ceiling_items_per_s: float, tokenize_s_per_item: float, cores: int) -> int:
    """Processes that tokenize ``ceiling_items_per_s`` at ``UTILIZATION``, each costing
    ``tokenize_s_per_item`` of one core an item; at least 1, at most ``cores``."""
    if ceiling_items_per_s <= 0 or tokenize_s_per_item <= 0:
        return 1
    need = ceiling_items_per_s * tokenize_s_per_item / UTILIZATION
    return max(1, min(max(1, cores), math.ceil(need)))


def grown_size(
    current: int,
    ceiling_items_per_s: float,
    cost_s_per_item: float,
    waited_share: float,
    cores: int,
) -> int:
    """The pool's size after a window in which its processes spent ``cost_s_per_item``
    of wall time a text and the launch waited for ids ``waited_share`` of the time: what
    ``processes_for`` says at that cost, when the launch waited enough for the pool to
    be what holds it; never smaller (a lull is not a reason to stop processes that a
    job's next minute needs)."""
    if waited_share < WAIT_SHARE:
        return current
    return max(current, processes_for(ceiling_items_per_s, cost_s_per_item, cores))


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


def _tokenize(texts: list[str]) -> tuple[bytes, bytes, float]:
    """In a pool process: every text's ids end to end, each text's count (int32), and
    the wall time it took (on a loaded host, more than the CPU time)."""
    assert _encode is not None, "the pool's initializer sets the encoder"
    t0 = time.perf_counter()
    flat, lens = array("i"), array("i")
    for text in texts:
        ids = _encode(text)
        flat.extend(ids)
        lens.append(len(ids))
    return flat.tobytes(), lens.tobytes(), time.perf_counter() - t0


class TokenizerPool:
    """``packed(texts)`` -> (ids end to end [int32], lengths [int32], starts [int64]):
    the arguments of the packed launch, tokenized in ``processes`` processes.

    ``sizing`` (the GPU's ceiling in items/s, the cores the pool may use): grow while the
    launch waits for ids (``grown_size``); None keeps ``processes`` (an operator's
    count, or a test's)."""

    def __init__(
        self,
        model_dir: str,
        max_tokens: int,
        processes: int,
        sizing: tuple[float, int] | None = None,
    ):
        if processes < 1:
            raise ValueError("a tokenizer pool needs at least one process")
        self.processes = processes
        self._args = (model_dir, max_tokens)
        self._sizing = sizing
        self._lock = threading.Lock()  # the window's sums and the executor swap
        self._window = _Window(time.monotonic())
        self._growing = False
        self._retired: list[ProcessPoolExecutor] = []
        self._pool = self._executor(processes)

    def _executor(self, processes: int) -> ProcessPoolExecutor:
        pool = ProcessPoolExecutor(
            max_workers=processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start,
            initargs=self._args,
        )
        # Start every process now (each loads the tokenizer), not on the first batch.
        list(pool.map(_tokenize, [["warm"]] * processes))
        return pool

    def packed(self, texts: Sequence[str]) -> tuple[Any, Any, Any]:
        return self.start(texts)()

    def start(self, texts: Sequence[str]) -> Callable[[], tuple[Any, Any, Any]]:
        """Hand ``texts`` to the processes now; the returned call waits for their ids
        (raising BrokenProcessPool if a process died meanwhile)."""
        n = len(texts)
        parts = min(self.processes, max(1, n // MIN_CHUNK))
        step = max(1, -(-n // parts))
        chunks = [list(texts[i : i + step]) for i in range(0, n, step)]
        with self._lock:  # not into an executor that a growth is retiring
            futures = [self._pool.submit(_tokenize, chunk) for chunk in chunks]
        self._maybe_grow()

        def ids() -> tuple[Any, Any, Any]:
            t0 = time.perf_counter()
            got = [f.result() for f in futures]
            with self._lock:
                self._window.add(n, sum(g[2] for g in got), time.perf_counter() - t0)
            return _joined(got, n)

        return ids

    def _maybe_grow(self) -> None:
        """At the end of each window: grow in a thread of its own when the window says
        so (its new processes start while the old ones keep tokenizing)."""
        if self._sizing is None:
            return
        now = time.monotonic()
        with self._lock:
            w = self._window
            if self._growing or now - w.since < RESIZE_EVERY_S or not w.texts:
                return
            self._window = _Window(now)
            ceiling, cores = self._sizing
            want = grown_size(
                self.processes, ceiling, w.encode_s / w.texts, w.waited_s / (now - w.since), cores
            )
            if want <= self.processes:
                return
            self._growing = True
        log.info(
            "tokenizer pool: %d -> %d process(es): %.1f us a text, the launch waited %.0f%%",
            self.processes,
            want,
            w.encode_s / w.texts * 1e6,
            100 * w.waited_s / (now - w.since),
        )
        grow = threading.Thread(target=self._grow, args=(want,), name="tokenizer-grow")
        grow.daemon = True
        grow.start()

    def _grow(self, processes: int) -> None:
        try:
            bigger = self._executor(processes)
        except Exception:  # the pool stays as it is
            log.exception("the tokenizer pool could not grow")
            with self._lock:
                self._growing = False
            return
        with self._lock:
            self._growing = False
            closed = self._sizing is None  # closed while the new processes started
            if not closed:
                old, self._pool, self.processes = self._pool, bigger, processes
                self._retired.append(old)
        if closed:
            _stop(bigger)
            return
        old.shutdown(wait=False)  # what it was given still completes

    def close(self) -> None:
        """Stop the processes now. A pool broken by a dead process may hold one that never
        finished starting, which the executor's exit handler would wait for forever (the
        worker, or a test run, then never exits): what is left is terminated. Its
        processes hold nothing but a tokenizer. (``_processes`` is the executor's own map;
        there is no public one.)"""
        with self._lock:
            pools = [self._pool, *self._retired]
            self._sizing = None  # no growing after this
        for pool in pools:
            _stop(pool)


def _stop(pool: ProcessPoolExecutor) -> None:
    """An executor's processes stopped now, whatever they hold (``TokenizerPool.close``)."""
    procs = dict(getattr(pool, "_processes", None) or {})
    pool.shutdown(wait=False, cancel_futures=True)
    procs.update(getattr(pool, "_processes", None) or {})
    for proc in procs.values():
        with contextlib.suppress(OSError, ValueError):  # gone already, or closed
            proc.kill()


@dataclass
class _Window:
    """What a window of batches measured: texts tokenized, the processes' wall time on
    them, and how long the launch waited for their ids."""

    since: float
    texts: int = 0
    encode_s: float = 0.0
    waited_s: float = 0.0

    def add(self, texts: int, encode_s: float, waited_s: float) -> None:
        self.texts += texts
        self.encode_s += encode_s
        self.waited_s += waited_s


def _joined(got: list[tuple[bytes, bytes, float]], n: int) -> tuple[Any, Any, Any]:
    import numpy as np

    flat = np.frombuffer(b"".join(g[0] for g in got), dtype=np.int32)
    lens = np.frombuffer(b"".join(g[1] for g in got), dtype=np.int32)
    starts = np.zeros(n, dtype=np.int64)
    if n > 1:
        np.cumsum(lens[:-1], out=starts[1:])
    return flat, lens, starts
