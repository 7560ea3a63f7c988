"""Messages between a scheduler and its worker processes.

They travel over ``multiprocessing.connection`` (a local socket with an auth
key), so a model that crashes or hangs takes down only its worker process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.generation import StepOutput, StepPlan

if TYPE_CHECKING:
    import numpy as np


@dataclass
class GenerationInfo:
    """What a worker's generation model gives the scheduler's continuous-batching policy
    (scheduler/generation/config.py, decision 23): its KV pool, sized by the worker from
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


@dataclass
class Hello:
    worker_id: str
    pid: int
    device: str
    models: list[ModelInfo]


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
