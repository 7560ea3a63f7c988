"""The worker process: load models, warm up, then run one batch at a time.

It connects to its scheduler's socket, announces the models it serves with
their measured cost profile, and then answers every WorkBatch with a
WorkResult. When the scheduler goes away the worker exits: it never runs
work that nobody will persist.

A worker spawned by a scheduler ignores SIGTERM/SIGINT (a stop signal sent to
the whole process group must not cut the scheduler's drain short: the scheduler
stops its workers itself once their work is persisted) and asks the kernel to
kill it when that scheduler dies, so even a worker hung in a model cannot
outlive it. A worker started by hand treats SIGTERM/SIGINT gracefully: it
finishes the batch it is computing, sends the result, then exits.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import sys
import time
import traceback
from multiprocessing.connection import Client
from types import FrameType

from gristmill.config import Settings
from workers.models.base import Model
from workers.models.registry import build_specs, latest
from workers.protocol import Hello, ModelInfo, WorkBatch, WorkResult

log = logging.getLogger("gristmill.worker")

# Benchmarks ask for the model's per-batch measurements (CUDA events on) in every result.
_REPORT_STATS = os.environ.get("GRISTMILL_WORKER_STATS") == "1"


def load_models(settings: Settings, names: list[str]) -> dict[tuple[str, str], Model]:
    """Load every requested ``name`` or ``name@version`` (all versions for a bare name)."""
    specs = build_specs(settings)
    models: dict[tuple[str, str], Model] = {}
    for ref in names:
        name, _, version = ref.partition("@")
        if name not in specs:
            raise SystemExit(f"unknown model {name!r}; known: {', '.join(sorted(specs))}")
        versions = specs[name]
        chosen = [versions[version]] if version else list(versions.values())
        if version and version not in versions:
            raise SystemExit(f"unknown version {ref!r}")
        for spec in chosen or [latest(versions)]:
            models[(spec.name, spec.version)] = spec.load()
    return models


def run_batch(models: dict[tuple[str, str], Model], batch: WorkBatch) -> WorkResult:
    start = time.time()
    try:
        model = models[(batch.model, batch.version)]
        outputs = model.predict(batch.inputs, batch.params)
        if len(outputs) != len(batch.inputs):
            raise RuntimeError(f"model returned {len(outputs)} outputs for {len(batch.inputs)}")
        stats = getattr(model, "last_stats", None) if _REPORT_STATS else None
        return WorkResult(batch.batch_id, outputs, None, start, time.time(), stats)
    except Exception as exc:  # the scheduler decides about retries; we only report
        log.warning("batch %s failed: %s", batch.batch_id, exc)
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return WorkResult(batch.batch_id, None, detail, start, time.time())


class _Shutdown:
    """SIGTERM/SIGINT: exit now when idle, after the current batch when busy."""

    def __init__(self) -> None:
        self.busy = False
        self.requested = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        if not self.busy:
            raise SystemExit(0)


def _spawned_by_scheduler() -> bool:
    return os.environ.get("GRISTMILL_WORKER_PARENT_PID") == str(os.getppid())


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG: the kernel SIGKILLs us when the spawning scheduler dies."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError) as exc:
        log.warning("cannot tie the worker's life to its scheduler: %s", exc)
        return
    if os.getppid() != parent:  # it died before we asked
        raise SystemExit(0)


def serve(
    settings: Settings,
    socket_path: str,
    authkey: bytes,
    model_names: list[str],
    worker_id: str | None = None,
) -> None:
    shutdown = _Shutdown()
    if _spawned_by_scheduler():
        _die_with_parent()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        shutdown.install()
    models = load_models(settings, model_names)
    infos = []
    for (name, version), model in models.items():
        if _REPORT_STATS and hasattr(model, "timing"):
            model.timing = True
        profile = model.warmup()
        # Warmup may bound the batch below the spec's (GPU memory per batch size).
        limit = model.batch_limit()
        profile = {n: ms for n, ms in profile.items() if n <= limit}
        infos.append(ModelInfo(name, version, limit, profile))
        log.info(
            "model %s@%s ready, max batch %d, warmup profile %s", name, version, limit, profile
        )
    wid = worker_id or f"{socket.gethostname()}-{os.getpid()}"
    device = os.environ.get("CUDA_VISIBLE_DEVICES", "cpu")
    conn = Client(socket_path, family="AF_UNIX", authkey=authkey)
    conn.send(Hello(worker_id=wid, pid=os.getpid(), device=device, models=infos))
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            log.info("scheduler went away; worker %s exits", wid)
            return
        if batch is None:  # orderly shutdown
            return
        shutdown.busy = True
        result = run_batch(models, batch)
        try:
            conn.send(result)
        except OSError:
            log.info("scheduler went away mid-batch; worker %s exits", wid)
            return
        shutdown.busy = False
        if shutdown.requested:
            log.info("worker %s finished its batch and exits on request", wid)
            return
