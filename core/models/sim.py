"""``sim``: a simulated accelerator with the classic batch-function contract.

1 to ``max_batch_size`` inputs, a fixed cost per batch whatever its size, one
batch at a time. Each output is derived from its own input (a digest), so tests
can check that every caller received its own answer. The model itself runs in a
worker (workers/models/sim.py).
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from core.models.spec import ModelSpec, ParamSpec

if TYPE_CHECKING:
    import numpy as np

# Vector mode draws each answer from this many fixed unit vectors: enough that callers
# rarely share one, few enough that the table costs nothing to build.
VECTOR_TABLE_ROWS = 4096


def sim_output(input_: str, salt: str = "", variant: str = "") -> dict[str, Any]:
    """The answer ``sim`` gives for one input; tests and the chaos audit recompute it.
    A ``variant`` (a registered version's config) gives other answers, as a retrained
    model would; the default keeps the built-in version's."""
    key = f"{salt}\x00{input_}" if not variant else f"{variant}\x00{salt}\x00{input_}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return {"digest": digest, "chars": len(input_)}


@lru_cache(maxsize=4)
def _vector_table(dim: int) -> np.ndarray:
    import numpy as np

    table = np.random.default_rng(dim).standard_normal((VECTOR_TABLE_ROWS, dim))
    table /= np.linalg.norm(table, axis=1, keepdims=True)
    return table.astype(np.float32)


def sim_vectors(inputs: list[str], salt: str, dim: int) -> np.ndarray:
    """Vector mode's answers: one float32 row of ``dim`` per input, chosen by a checksum
    of the input, so each is reproducible and costs no compute (a store benchmark
    measures everything but the model)."""
    rows = [zlib.crc32(f"{salt}\x00{x}".encode()) % VECTOR_TABLE_ROWS for x in inputs]
    return _vector_table(dim)[rows]


@dataclass
class SimSpec(ModelSpec):
    batch_ms: float = 100.0  # the cost of one batch, whatever its size
    variant: str = ""  # changes every answer (sim_output)
    # Memory a worker sets aside while this version is loaded (MB): lets the residency
    # policy be exercised with a model that costs nothing to run.
    memory_mb: float = 0.0
    # How long loading it takes (ms): a version that is visibly "loading" for a while.
    load_ms: float = 0.0
    # > 0: answers are float32 vectors of this length (sim_vectors), like an embedding.
    vector_dim: int = 0
    params: tuple[ParamSpec, ...] = field(
        default_factory=lambda: (ParamSpec("salt", str, "", batching=True),)
    )

    def embedding_dim(self) -> int | None:
        return self.vector_dim or None
