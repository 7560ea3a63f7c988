"""ingest/schemas.py: malformed JSON is 400, a schema violation 422, naming the field."""

from __future__ import annotations

import pytest

from core.errors import InvalidInput, SchemaViolation
from ingest.schemas import InferBody, parse_body


def test_a_valid_body_parses() -> None:
    body = parse_body(b'{"model": "sim", "input": "hi", "timeout_ms": 500}', InferBody)
    assert (body.model, body.input, body.timeout_ms, body.params) == ("sim", "hi", 500, None)


@pytest.mark.parametrize("raw", [b"", b"   ", b"{not json", b"[1, 2]", b'"text"'])
def test_not_a_json_object_is_400(raw: bytes) -> None:
    with pytest.raises(InvalidInput):
        parse_body(raw, InferBody)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"model": "sim"}', "input"),
        (b'{"model": "", "input": "x"}', "model"),
        (b'{"model": "sim", "input": "x", "timeout_ms": 0}', "timeout_ms"),
        (b'{"model": "sim", "input": "x", "timeout_ms": "5"}', "timeout_ms"),
        (b'{"model": "sim", "input": "x", "colour": "red"}', "colour"),
        (b'{"model": "sim", "input": "x", "params": [1]}', "params"),
    ],
)
def test_a_schema_violation_is_422_naming_the_field(raw: bytes, field: str) -> None:
    with pytest.raises(SchemaViolation) as err:
        parse_body(raw, InferBody)
    assert err.value.status == 422 and err.value.field == field
