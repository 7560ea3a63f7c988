"""Messages between a scheduler and its worker processes.

They travel over ``multiprocessing.connection`` (a local socket with an auth
key), so a model that crashes or hangs takes down only its worker process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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


@dataclass
class WorkResult:
    batch_id: str
    outputs: list[Any] | None
    error: str | None
    compute_start: float  # epoch s
    compute_end: float
