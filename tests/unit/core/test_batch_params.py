"""The batch key's part of a request's params (ModelSpec.batch_params): what it
answered before its names were worked out once a spec, it answers still."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from core.models.spec import ModelSpec, ParamSpec


def reference(spec: ModelSpec, params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The definition: every batching param's (name, value), sorted."""
    return tuple(sorted((p.name, params[p.name]) for p in spec.params if p.batching))


def spec_of(*params: ParamSpec) -> ModelSpec:
    return ModelSpec("m", "1", 8, params=params)


UNSORTED = spec_of(
    ParamSpec("zeta", str, ""),
    ParamSpec("alpha", int, 0),
    ParamSpec("mid", float, 1.0, batching=False),
    ParamSpec("beta", bool, True),
)


@pytest.mark.parametrize(
    "spec,params",
    [
        (UNSORTED, {"zeta": "z", "alpha": 3, "mid": 0.5, "beta": False}),
        (UNSORTED, {"zeta": ["un", "hashable"], "alpha": {"a": 1}, "beta": None, "mid": 1}),
        (spec_of(ParamSpec("a", str, ""), ParamSpec("b", str, "")), {"a": "1", "b": "2"}),
        (spec_of(ParamSpec("only", str, "")), {"only": "x", "extra": [1]}),
        (spec_of(ParamSpec("off", int, 0, batching=False)), {"off": 1}),
        (spec_of(), {}),
    ],
)
def test_sorted_by_name_with_the_values_as_given(spec: ModelSpec, params: dict[str, Any]) -> None:
    got = spec.batch_params(params)
    assert got == reference(spec, params) and type(got) is tuple
    assert spec.batch_params(params) == got  # from the worked-out names


def test_a_missing_param_names_the_first_declared() -> None:
    with pytest.raises(KeyError) as exc:
        UNSORTED.batch_params({"mid": 1.0, "beta": True})
    with pytest.raises(KeyError) as ref:
        reference(UNSORTED, {"mid": 1.0, "beta": True})
    assert exc.value.args == ref.value.args == ("zeta",)


def test_a_spec_whose_params_change_works_its_names_out_again() -> None:
    spec = spec_of(ParamSpec("a", str, ""))
    assert spec.batch_params({"a": "x", "b": "y"}) == (("a", "x"),)
    spec.params = (ParamSpec("b", str, ""), ParamSpec("a", str, ""))
    assert spec.batch_params({"a": "x", "b": "y"}) == (("a", "x"), ("b", "y"))
    copy = dataclasses.replace(spec, params=(ParamSpec("b", str, ""),))
    assert copy.batch_params({"a": "x", "b": "y"}) == (("b", "y"),)


def test_the_worked_out_names_leave_equality_and_fields_alone() -> None:
    a, b = spec_of(ParamSpec("a", str, "")), spec_of(ParamSpec("a", str, ""))
    a.batch_params({"a": ""})
    assert a == b and dataclasses.asdict(a) == dataclasses.asdict(b)
