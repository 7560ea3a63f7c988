"""``sim``: a simulated accelerator with the classic batch-function contract.

1 to ``max_batch_size`` inputs, a fixed cost per batch whatever its size, one
batch at a time. Each output is derived from its own input (a digest), so tests
can check that every caller received its own answer. The model itself runs in a
worker (workers/models/sim.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from core.models.spec import ModelSpec, ParamSpec


def sim_output(input_: str, salt: str = "", variant: str = "") -> dict[str, Any]:
    """The answer ``sim`` gives for one input; tests and the chaos audit recompute it.
    A ``variant`` (a registered version's config) gives other answers, as a retrained
    model would; the default keeps the built-in version's."""
    key = f"{salt}\x00{input_}" if not variant else f"{variant}\x00{salt}\x00{input_}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return {"digest": digest, "chars": len(input_)}


@dataclass
class SimSpec(ModelSpec):
    batch_ms: float = 100.0  # the cost of one batch, whatever its size
    variant: str = ""  # changes every answer (sim_output)
    # Memory a worker sets aside while this version is loaded (MB): lets the residency
    # policy be exercised with a model that costs nothing to run.
    memory_mb: float = 0.0
    # How long loading it takes (ms): a version that is visibly "loading" for a while.
    load_ms: float = 0.0
    params: tuple[ParamSpec, ...] = field(
        default_factory=lambda: (ParamSpec("salt", str, "", batching=True),)
    )
