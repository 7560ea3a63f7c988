"""sim's vector mode: an embedding's shape at no compute cost, for store benchmarks."""

from __future__ import annotations

import numpy as np

from core.config import Settings
from core.models.catalog import build_specs
from core.models.sim import SimSpec, sim_output, sim_vectors
from workers.models.sim import SimModel


def _sim(**env: object) -> SimModel:
    spec = build_specs(Settings(**env))["sim"]["1"]  # type: ignore[arg-type]
    assert isinstance(spec, SimSpec)
    return SimModel(spec)


def test_vector_mode_answers_a_float32_unit_vector_per_input() -> None:
    out = _sim(sim_vector_dim=384, sim_batch_ms=0).predict(["a", "b", "a"], {"salt": ""})
    assert isinstance(out, np.ndarray) and out.shape == (3, 384) and out.dtype == np.float32
    assert np.allclose(np.linalg.norm(out, axis=1), 1, atol=1e-5)
    assert (out[0] == out[2]).all() and not (out[0] == out[1]).all()
    assert (out == sim_vectors(["a", "b", "a"], "", 384)).all()


def test_the_salt_changes_the_vector() -> None:
    assert not (sim_vectors(["a"], "x", 8) == sim_vectors(["a"], "y", 8)).all()


def test_without_vector_mode_sim_answers_its_digest() -> None:
    assert _sim(sim_batch_ms=0).predict(["a"], {"salt": ""}) == [sim_output("a")]
