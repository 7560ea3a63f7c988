"""Messages between a scheduler and its worker processes.

They travel over ``multiprocessing.connection`` (a local socket with an auth
key), so a model that crashes or hangs takes down only its worker process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from core.generation import StepOutput, StepPlan
from core.models.registry import VersionRecord

if TYPE_CHECKING:
    import numpy as np


@dataclass
class GenerationInfo:
    """What a worker's generation model gives the scheduler's continuous-batching policy
    (scheduler/core/generation/config.py, decision 23): its KV pool, sized by the worker from
    its memory budget, and the step's limits."""

    num_blocks: int
    block_size: int
    max_model_len: int
    max_step_tokens: int
    max_running: int


@dataclass
class ModelInfo:
    name: str
    version: str
    max_batch_size: int
    profile_ms: dict[int, float] = field(default_factory=dict)  # warmup: ms per batch size
    # Set for a generation model: it takes GenStep messages, not batches.
    generation: GenerationInfo | None = None
    # What the worker loaded: the registry record it was asked for (or the built-in
    # one it started with), the digest its files had, and the memory it holds (bytes).
    record: VersionRecord | None = None
    sha256: str = ""
    memory_bytes: int = 0


def info_matches(record: VersionRecord, info: ModelInfo) -> bool:
    """Whether the version a worker loaded as ``info`` is the one ``record`` describes
    (a worker that booted with the built-in version holds the registry's when nothing
    that changes the computation differs and the digest it found is the pinned one)."""
    held = info.record
    if held is None:
        return False
    same = (held.backend, held.artifact, dict(held.config), held.max_batch_size) == (
        record.backend,
        record.artifact,
        dict(record.config),
        record.max_batch_size,
    )
    return same and (not record.sha256 or record.sha256 == info.sha256)


@dataclass
class Hello:
    worker_id: str
    pid: int
    device: str
    models: list[ModelInfo]
    # Its cost curves are its own (heterogeneous pools): "cpu", "cuda", or what the
    # deployment names it (settings.worker_class).
    worker_class: str = "cpu"
    memory_budget_bytes: int = 0  # what its models may hold together; 0: no limit
    accepts: tuple[str, ...] = ()  # model names it may load; empty: any


@dataclass
class LoadModel:
    """Scheduler -> worker: load, verify and warm up this version (ModelStatus follows)."""

    record: VersionRecord


@dataclass
class UnloadModel:
    """Scheduler -> worker: this scheduler no longer wants the version (drained: nothing
    of it is in flight); the worker frees it once no scheduler it serves wants it."""

    name: str
    version: str


# What a scheduler asks of a worker about a model version; the worker answers each
# with ModelStatus.
ModelCommand = LoadModel | UnloadModel


class ModelState(StrEnum):
    LOADING = "loading"  # verifying, loading, warming up
    READY = "ready"  # takes batches
    UNAVAILABLE = "unavailable"  # loaded, but what it calls is down (an open circuit)
    FAILED = "failed"  # will not serve: a sha256 mismatch, a load error
    UNLOADED = "unloaded"  # freed


@dataclass
class ModelStatus:
    """Worker -> scheduler, between results: where one version stands on this worker."""

    name: str
    version: str
    state: ModelState
    info: ModelInfo | None = None  # READY: what it loaded and measured
    error: str | None = None
    retry_after_s: float | None = None  # UNAVAILABLE: when it will try its upstream again


@dataclass
class WorkBatch:
    batch_id: str
    model: str
    version: str
    params: dict[str, Any]
    inputs: list[Any]
    # True: every input is a token-id string (core/models/token_ids.py) that the
    # API tier made; the text stays with the scheduler, which stores it.
    token_ids: bool = False
    # W3C trace context of the scheduler's batch span (core/tracing.py), when traced.
    traceparent: str | None = None
    # The earliest deadline of its inputs (epoch s): a worker serving several schedulers
    # launches the most urgent first (workers/ready.py, decision 76). None: no deadline.
    deadline: float | None = None


@dataclass
class GenStep:
    """One step of continuous batching (core/generation.py) for a generation model. The
    worker keeps a KV pool per scheduler connection and nothing per sequence: the plan
    says which tokens go where. ``batch_id`` names the step as a batch's id names the
    batch: answers come back in send order and are checked against it."""

    batch_id: str
    model: str
    version: str
    plan: StepPlan


@dataclass
class GenStepResult:
    batch_id: str
    output: StepOutput | None  # None: the step failed (``error``)
    error: str | None
    compute_start: float  # epoch s
    compute_end: float
    device: dict[str, float | str] | None = None


@dataclass
class WorkResult:
    batch_id: str
    # One output per input, in order: a list, or one numpy array whose rows are the
    # outputs (no per-float Python objects to make and pickle; stored as the same JSON).
    outputs: Sequence[Any] | np.ndarray | None
    error: str | None
    compute_start: float  # epoch s
    compute_end: float
    stats: dict[str, float] | None = None  # the model's own measurements (benchmarks)
    # The worker's GPU when it finished (workers/metrics.py): utilization, memory.
    device: dict[str, float | str] | None = None
    # The batch did not run for a reason that is not its inputs' (its model is not
    # loaded here, the service it calls is down): it goes back unchanged, no attempt
    # counted, and the scheduler sends that model's batches elsewhere until the worker
    # reports it ready again.
    unavailable: bool = False
    # When the worker read the batch off its pipe and when it began launching it (epoch
    # s): the batch row splits the wait between forming and computing into the way to
    # the worker, the worker's queue, and the device's (docs/bench/gpu-host.md, r18).
    received_at: float | None = None
    launched_at: float | None = None
    retry_after_s: float | None = None
