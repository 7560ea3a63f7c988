"""The fixed batch API every model implements.

A ``ModelSpec`` is light: ingest imports it to validate requests without loading
weights. ``spec.load()`` returns a ``Model``, which owns the weights and turns a
list of inputs into a list of outputs of the same length, in the same order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.errors import InvalidInput

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class ParamSpec:
    """A request parameter. ``batching`` params change the computation, so requests
    that differ in one never share a batch (they are part of the batch key)."""

    name: str
    type: type
    default: Any
    batching: bool = True


@dataclass
class ModelSpec(ABC):
    name: str
    version: str
    max_batch_size: int
    max_input_chars: int = 20_000
    params: tuple[ParamSpec, ...] = field(default_factory=tuple)

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def validate_input(self, value: Any) -> None:
        """Text models take one non-empty string per request."""
        if not isinstance(value, str):
            raise InvalidInput(f"input must be a string, got {type(value).__name__}", field="input")
        if not value.strip():
            raise InvalidInput("input must not be empty", field="input")
        if len(value) > self.max_input_chars:
            raise InvalidInput(
                f"input is {len(value)} characters; at most {self.max_input_chars} allowed",
                field="input",
            )

    def normalize_params(self, params: dict[str, Any] | None) -> dict[str, Any]:
        """Fill defaults and reject unknown or mistyped parameters."""
        params = dict(params or {})
        known = {p.name: p for p in self.params}
        unknown = sorted(set(params) - set(known))
        if unknown:
            allowed = ", ".join(sorted(known)) or "none"
            raise InvalidInput(
                f"unknown parameter {unknown[0]!r} for model {self.name} (allowed: {allowed})",
                field=f"params.{unknown[0]}",
            )
        out: dict[str, Any] = {}
        for p in self.params:
            value = params.get(p.name, p.default)
            # bool is an int subclass; do not let True pass as a number or vice versa.
            if not isinstance(value, p.type) or (p.type is not bool and isinstance(value, bool)):
                raise InvalidInput(
                    f"parameter {p.name} must be {p.type.__name__}", field=f"params.{p.name}"
                )
            out[p.name] = value
        return out

    def batch_params(self, params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
        """The part of the (normalized) params that goes into the batch key."""
        return tuple(sorted((p.name, params[p.name]) for p in self.params if p.batching))

    def message_input(self, value: Any) -> Any:
        """What the request message carries for a validated ``value``. Text models that
        can tokenize in the API tier return ``{"text", "ids"}`` (token_ids.py); the
        default carries the input as it came."""
        return value

    @abstractmethod
    def load(self) -> Model:
        """Load weights and return a ready model (called in the worker process only)."""


@dataclass
class Launched:
    """A batch whose computation has started (``Model.launch``); ``Model.finish``
    returns its outputs. ``stats``: the model's own measurements for this batch."""

    outputs: Sequence[Any] | np.ndarray | None = None
    stats: dict[str, float] | None = None

    def computing(self) -> bool:
        """Whether its work may still run on a device (``finish`` waits for it)."""
        return self.outputs is None


class Model(ABC):
    spec: ModelSpec

    @abstractmethod
    def predict(self, inputs: Sequence[Any], params: dict[str, Any]) -> Sequence[Any] | np.ndarray:
        """Outputs for ``inputs``, same length, same order. One call at a time.

        A list, or a numpy array whose rows are the outputs (results/store.py writes
        a row as the same JSON as the list of its values)."""

    def launch(
        self, inputs: Sequence[Any], params: dict[str, Any], *, token_ids: bool = False
    ) -> Launched:
        """Start computing a batch; ``finish`` returns its outputs.

        The worker launches the batch it has queued while the one before it finishes, so
        a model on an accelerator can enqueue its work behind the running batch (the
        device still runs them one at a time, in order) and the host-side preparation
        overlaps the device. This default computes the whole batch here and now.
        ``token_ids``: every input is a token-id string (core/models/token_ids.py).
        """
        if token_ids:
            inputs = [{"ids": s} for s in inputs]
        out = self.predict(inputs, params)
        stats = getattr(self, "last_stats", None)
        return Launched(out, dict(stats) if stats else None)

    def finish(self, job: Launched) -> Sequence[Any] | np.ndarray:
        """The outputs of a launched batch (waits for the device where needed)."""
        assert job.outputs is not None
        return job.outputs

    def warmup(self) -> dict[int, float]:
        """Run representative batches; return measured ms per batch by batch size."""
        return {}

    def batch_limit(self) -> int:
        """The largest batch this model takes (after warmup: bounded by what it measured)."""
        return self.spec.max_batch_size


def memory_batch_limit(
    peak_bytes: dict[int, int], reserved_bytes: int, free_bytes: int, requested: int
) -> int:
    """The largest batch size whose measured peak memory fits, at most ``requested``.

    ``peak_bytes`` by batch size includes ``reserved_bytes`` already held (captured
    graphs), which ``free_bytes`` no longer counts; a tenth of what is free is kept
    back for fragmentation. Unmeasured sizes above the largest fitting one are not
    trusted; at least 1.
    """
    budget = 0.9 * free_bytes
    fits = [n for n, b in peak_bytes.items() if b - reserved_bytes <= budget]
    if not peak_bytes:
        return requested
    if not fits:
        return 1
    best = max(fits)
    return requested if best >= max(peak_bytes) else min(best, requested)
