"""Messages between a scheduler and its worker processes.

They travel over ``multiprocessing.connection`` (a local socket with an auth
key), so a model that crashes or hangs takes down only its worker process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


@dataclass
class ModelInfo:
    name: str
    version: str
    max_batch_size: int
    profile_ms: dict[int, float] = field(default_factory=dict)  # warmup: ms per batch size


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
