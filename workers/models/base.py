"""The fixed batch API every model implements in a worker.

A ``Model`` owns the weights and turns a list of inputs into a list of outputs of
the same length, in the same order; its ``spec`` (core/models/spec.py) says what
it accepts. workers/models/loader.py makes one from a spec.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.models.spec import ModelSpec
from core.protocol import ModelState

if TYPE_CHECKING:
    import numpy as np


@dataclass
class Launched:
    """A batch whose computation has started (``Model.launch``); ``Model.finish``
    returns its outputs. ``stats``: the model's own measurements for this batch."""

    outputs: Sequence[Any] | np.ndarray | None = None
    stats: dict[str, float] | None = None

    def computing(self) -> bool:
        """Whether its work may still run on a device (``finish`` waits for it)."""
        return self.outputs is None


class ModelUnavailable(Exception):
    """The batch cannot run here for a reason that is not its inputs' (the service the
    model calls is down): the worker hands it back unrun (WorkResult.unavailable)."""

    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


# (state, error, retry after s): a model that can go unavailable and come back by itself
# (an HTTP backend's circuit) reports it through this; the worker tells its schedulers.
StatusListener = Callable[[ModelState, str | None, float | None], None]


class Model(ABC):
    spec: ModelSpec
    status_listener: StatusListener | None = None

    @abstractmethod
    def predict(self, inputs: Sequence[Any], params: dict[str, Any]) -> Sequence[Any] | np.ndarray:
        """Outputs for ``inputs``, same length, same order. One call at a time.

        A list, or a numpy array whose rows are the outputs (results/store.py writes
        a row as the same JSON as the list of its values)."""

    def prepare(
        self, inputs: Sequence[Any], *, token_ids: bool = False, deadline: float | None = None
    ) -> Any:
        """Start the host-side work of a batch that will be launched later (tokenizing its
        texts), so that it overlaps the batches ahead of it; ``launch`` takes what this
        returns as ``ahead``. ``deadline``: the batch's earliest (epoch s), so that host
        work shared by batches goes to the most urgent first. None: nothing to start
        (this default)."""
        return None

    def launch(
        self,
        inputs: Sequence[Any],
        params: dict[str, Any],
        *,
        token_ids: bool = False,
        ahead: Any = None,
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

    def memory_bytes(self) -> int:
        """What this loaded model holds (weights, captured graphs, buffers), in bytes."""
        return 0

    def available(self) -> bool:
        """Whether batches can run now (False while what it calls is down)."""
        return True

    def close(self) -> None:  # noqa: B027 - most models hold nothing to free
        """Free what it holds (unloaded): threads, connections, device memory."""


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
