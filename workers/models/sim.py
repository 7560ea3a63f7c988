"""``sim``: a simulated accelerator with the classic batch-function contract.

1 to ``max_batch_size`` inputs, a fixed cost per batch whatever its size, one
batch at a time. Each output is derived from its own input (a digest), so tests
can check that every caller received its own answer.

Test-only fault trigger, off unless ``GRISTMILL_SIM_POISON_PREFIX`` is set (it
is deliberately not a documented setting): an input that starts with the prefix
followed by ``crash`` kills the worker process (like a segfault), ``hang``
blocks it forever, ``error`` raises. Used by the poison-input tests.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.models.base import Model, ModelSpec, ParamSpec


def sim_output(input_: str, salt: str = "") -> dict[str, Any]:
    """The answer ``sim`` gives for one input; tests and the chaos audit recompute it."""
    digest = hashlib.sha256(f"{salt}\x00{input_}".encode()).hexdigest()[:16]
    return {"digest": digest, "chars": len(input_)}


@dataclass
class SimSpec(ModelSpec):
    batch_ms: float = 100.0
    params: tuple[ParamSpec, ...] = field(
        default_factory=lambda: (ParamSpec("salt", str, "", batching=True),)
    )
    poison_prefix: str = ""  # test-only fault trigger (settings.sim_poison_prefix)

    def load(self) -> Model:
        return SimModel(self)


class SimModel(Model):
    def __init__(self, spec: SimSpec):
        self.spec: SimSpec = spec
        self._batch_s = spec.batch_ms / 1000.0

    def predict(self, inputs: Sequence[Any], params: dict[str, Any]) -> list[Any]:
        if not 1 <= len(inputs) <= self.spec.max_batch_size:
            raise ValueError(f"batch of {len(inputs)}; sim takes 1..{self.spec.max_batch_size}")
        if self.spec.poison_prefix:
            for x in inputs:
                if isinstance(x, str) and x.startswith(self.spec.poison_prefix):
                    _poisoned(x[len(self.spec.poison_prefix) :])
        time.sleep(self._batch_s)
        salt = params.get("salt", "")
        return [sim_output(x, salt) for x in inputs]

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
