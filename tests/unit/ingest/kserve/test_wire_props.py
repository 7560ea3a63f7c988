"""ingest/kserve/wire.py under hypothesis: whatever a client sends as the body or as
``Inference-Header-Content-Length``, the parser answers a request or an ``InvalidInput``
naming the field, never another exception (a 500), at any nesting, size or digit script."""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core.config import Settings
from core.errors import InvalidInput
from ingest.kserve.wire import (
    HEADER_LENGTH,
    MAX_DATA_DEPTH,
    MAX_INPUTS,
    decode_bytes_tensor,
    encode_bytes_tensor,
    parse_infer,
)
from tests.unit.json_strategies import json_values

S = Settings()
FAST = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


def parse(body: Any, header: str | None = None) -> Any:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    try:
        return parse_infer(raw, header, S)
    except InvalidInput as exc:
        return exc


def answered_or_named(got: Any) -> bool:
    """A parse either refuses, saying what is wrong, or gives texts to run."""
    if isinstance(got, InvalidInput):
        return bool(got.message)
    return bool(got.texts) and all(isinstance(t, str) for t in got.texts)


def deep_body(depth: int) -> bytes:
    """A request whose ``data`` is ``depth`` arrays around one text, as raw JSON (a
    serializer would refuse to write it)."""
    data = b"[" * depth + b'"x"' + b"]" * depth
    head = b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": '
    return head + data + b"}]}"


def tensor(data: Any, shape: Any = (1,), **extra: Any) -> dict[str, Any]:
    return {"name": "text", "datatype": "BYTES", "shape": list(shape), "data": data, **extra}


# --- nesting -----------------------------------------------------------------------------


@FAST
@given(depth=st.integers(min_value=MAX_DATA_DEPTH + 1, max_value=900))
@example(depth=500)  # the reported body: ~1.3 KB, a RecursionError and a 500 before
def test_data_nested_past_the_shape_is_a_400_naming_the_depth_limit(depth: int) -> None:
    got = parse(deep_body(depth))
    assert isinstance(got, InvalidInput), got
    assert "depth limit" in got.message or "JSON" in got.message, got.message
    if "depth limit" in got.message:
        assert got.field == "inputs[0].data"
        assert len(got.message) < 200


def test_nesting_as_deep_as_the_shape_allows_is_read() -> None:
    assert parse({"inputs": [tensor([["a"], ["b"]], (2, 1))]}).texts == ["a", "b"]


@FAST
@given(data=json_values)
def test_any_json_as_data_is_answered_or_named(data: Any) -> None:
    got = parse({"inputs": [tensor(data, (1,))]})
    if not isinstance(got, InvalidInput):  # one text, flat or nested within the limit
        assert len(got.texts) == 1 and isinstance(got.texts[0], str)


@FAST
@given(body=json_values)
def test_any_json_body_is_answered_or_named(body: Any) -> None:
    assert answered_or_named(parse(body))  # raises nothing but InvalidInput


@FAST
@given(
    inputs=st.lists(json_values, max_size=3),
    outputs=json_values,
    parameters=json_values,
    rid=json_values,
)
def test_any_json_in_each_field_is_answered_or_named(
    inputs: list[Any], outputs: Any, parameters: Any, rid: Any
) -> None:
    for body in (
        {"inputs": inputs, "outputs": outputs},
        {"inputs": [tensor(["a"])], "outputs": outputs},
        {"inputs": [tensor(["a"])], "parameters": parameters},
        {"inputs": [tensor(["a"], parameters=parameters)]},
        {"id": rid, "inputs": [tensor(["a"])]},
        {"inputs": [{**tensor(["a"]), "shape": parameters}]},
    ):
        assert answered_or_named(parse(body))


# --- sizes -------------------------------------------------------------------------------


@FAST
@given(n=st.integers(min_value=-5, max_value=3 * MAX_INPUTS), k=st.integers(0, 40))
def test_shapes_and_element_counts_that_disagree_are_named(n: int, k: int) -> None:
    got = parse({"inputs": [tensor(["t"] * k, (n,))]})
    if 1 <= n <= MAX_INPUTS and n == k:
        assert got.texts == ["t"] * k
    else:
        assert isinstance(got, InvalidInput) and got.field is not None


@FAST
@given(blob=st.binary(max_size=64), size=st.integers(min_value=-3, max_value=2**64 - 1))
def test_binary_tensors_of_any_bytes_and_size_are_answered_or_named(blob: bytes, size: int) -> None:
    head = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "datatype": "BYTES",
                    "shape": [1],
                    "parameters": {"binary_data_size": size},
                }
            ]
        }
    )
    assert answered_or_named(parse(head + blob, str(len(head))))
    with contextlib.suppress(InvalidInput):
        assert all(isinstance(t, str) for t in decode_bytes_tensor(blob, "t"))


# --- Inference-Header-Content-Length ----------------------------------------------------


@FAST
@given(header=st.text(max_size=30))
@example(header="²")  # a digit that is not ASCII: int() refuses it, isdigit() does not
@example(header="١٢")  # Arabic-Indic digits, which int() reads
@example(header="9" * 5000)  # past int()'s digit limit
@example(header=" 12")
@example(header="+12")
@example(header="1_2")
def test_the_header_length_is_ascii_digits_or_a_400_naming_it(header: str) -> None:
    head = orjson.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1]}]})
    blob = encode_bytes_tensor([b"hi"])
    got = parse(head + blob, header)
    if header == str(len(head)):
        assert got.texts == ["hi"]
    else:
        # ASCII digits of another length cut the JSON or the tensor elsewhere: named
        # there; anything else is named as the header.
        assert isinstance(got, InvalidInput)
        if not (header.isascii() and header.isdigit() and len(header) <= 18):
            assert got.field == HEADER_LENGTH


@pytest.mark.parametrize("digits", ["²", "١٢", "߁", "\U0001d7d9", "٣"])
def test_unicode_digits_never_pass_as_a_length(digits: str) -> None:
    got = parse(b'{"inputs": []}', digits)
    assert isinstance(got, InvalidInput) and got.field == HEADER_LENGTH
