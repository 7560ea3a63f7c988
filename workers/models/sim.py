"""The ``sim`` model (core/models/sim.py) as a worker runs it: it sleeps its batch cost.

Test-only fault trigger, off unless ``GRISTMILL_SIM_POISON_PREFIX`` is set (it
is deliberately not a documented setting): an input that starts with the prefix
followed by ``crash`` kills the worker process (like a segfault), ``hang``
blocks it forever, ``error`` raises. Used by the poison-input tests.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from typing import Any

from core.models.sim import SimSpec, sim_output, sim_vectors
from workers.models.base import Model


class SimModel(Model):
    def __init__(self, spec: SimSpec, poison_prefix: str = ""):
        self.spec: SimSpec = spec
        self.poison_prefix = poison_prefix  # test-only fault trigger (see above)
        self._batch_s = spec.batch_ms / 1000.0
        # What a version's weights would hold: really allocated, so the worker's memory
        # accounting measures something (spec.memory_mb, 0 by default).
        self._held = bytearray(int(spec.memory_mb * 1_000_000))
        time.sleep(spec.load_ms / 1000)  # a version that takes a while to load

    def predict(self, inputs: Sequence[Any], params: dict[str, Any]) -> Any:
        if not 1 <= len(inputs) <= self.spec.max_batch_size:
            raise ValueError(f"batch of {len(inputs)}; sim takes 1..{self.spec.max_batch_size}")
        if self.poison_prefix:
            for x in inputs:
                if isinstance(x, str) and x.startswith(self.poison_prefix):
                    _poisoned(x[len(self.poison_prefix) :])
        if self._batch_s > 0:
            time.sleep(self._batch_s)
        salt = params.get("salt", "")
        if self.spec.vector_dim:
            # A variant draws other vectors, as it gives other digests.
            vsalt = f"{self.spec.variant}\x00{salt}" if self.spec.variant else salt
            return sim_vectors(list(inputs), vsalt, self.spec.vector_dim)
        return [sim_output(x, salt, self.spec.variant) for x in inputs]

    def memory_bytes(self) -> int:
        return len(self._held)

    def close(self) -> None:
        self._held = bytearray()

    def warmup(self) -> dict[int, float]:
        # The cost is flat by construction; report it rather than sleep through a sweep.
        return {1: self.spec.batch_ms, self.spec.max_batch_size: self.spec.batch_ms}


def _poisoned(kind: str) -> None:
    if kind.startswith("crash"):
        os.kill(os.getpid(), signal.SIGKILL)
    if kind.startswith("hang"):
        while True:
            time.sleep(3600)
    if kind.startswith("error"):
        raise ValueError("sim was fed a poison input")
