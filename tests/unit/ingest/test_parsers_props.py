"""The API's other parsers under hypothesis: bodies nested to any depth, values of any
size, numbers written in any script's digits. Each answers a value or a 4xx error naming
the field (``InvalidInput``, ``SchemaViolation``), never another exception (a 500)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core.config import Settings
from core.errors import InvalidInput, SchemaViolation
from core.limits import ascii_decimal
from ingest.acceptance.prefer import parse_prefer
from ingest.jobs.schemas import parse_index
from ingest.native.wire import parse_infer
from ingest.openai import batch_wire as bw
from ingest.openai.completion_wire import resume_from as _resume_from
from ingest.openai.wire import parse_embeddings
from tests.unit.json_strategies import json_values

S = Settings()
FAST = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
REFUSED = (InvalidInput, SchemaViolation)

# Digits of many scripts (Nd), superscripts and other numerals (No), ASCII, signs, spaces.
digitish = st.text(
    st.characters(categories=["Nd", "No"]) | st.sampled_from("0123456789+-_ .e"), max_size=24
)


def deep(depth: int, open_: bytes = b"[", close: bytes = b"]") -> bytes:
    return open_ * depth + b"1" + close * depth


@FAST
@given(text=digitish | st.text(max_size=30))
@example(text="²")
@example(text="٣")
@example(text="9" * 5000)
def test_ascii_decimal_reads_ascii_digits_only(text: str) -> None:
    got = ascii_decimal(text)
    if text.isascii() and text.isdigit() and len(text) <= 18:
        assert got == int(text)
    else:
        assert got is None


@FAST
@given(text=digitish | st.text(max_size=30))
@example(text="²")
@example(text="\u0661")  # ARABIC-INDIC DIGIT ONE, which int() reads
@example(text="9" * 5000)
def test_last_event_id_is_a_token_index_or_a_400_naming_it(text: str) -> None:
    try:
        start = _resume_from(text)
    except InvalidInput as exc:
        assert exc.field == "Last-Event-ID"
        return
    assert 0 <= start <= 1 << 20
    assert text == "-1" or (text.isascii() and text.isdigit())


@FAST
@given(text=digitish | st.text(max_size=30))
@example(text="٣")
def test_cursors_are_ascii_integers_in_range(text: str) -> None:
    try:
        n = parse_index(text, "cursor", default=0, low=0, high=2**31 - 1)
    except InvalidInput as exc:
        assert exc.field == "cursor"
        return
    assert text.isascii() and n == int(text)


@FAST
@given(values=st.lists(st.text(max_size=40), max_size=4))
@example(values=["respond-async, wait=٣"])
@example(values=["wait=" + "9" * 5000])
def test_prefer_never_fails_and_reads_ascii_waits_only(values: list[str]) -> None:
    prefer = parse_prefer(values)
    assert prefer.wait_s is None or 0 <= prefer.wait_s < 10**9


@FAST
@given(depth=st.integers(min_value=0, max_value=1_500), where=st.sampled_from(["input", "params"]))
@example(depth=500, where="input")
@example(depth=1_100, where="params")
def test_infer_bodies_nested_to_any_depth_are_refused_naming_it(depth: int, where: str) -> None:
    if where == "input":
        raw = b'{"model": "sim", "input": ' + deep(depth) + b"}"
    else:
        raw = b'{"model": "sim", "input": "x", "params": ' + deep(depth, b'{"a":', b"}") + b"}"
    try:
        parse_infer(raw, S)
    except REFUSED as exc:
        assert depth > 0 or where == "params"
        assert len(exc.message) < 300
        return
    assert depth <= S.max_json_depth


@FAST
@given(body=json_values)
def test_any_json_as_an_infer_body_is_answered_or_named(body: Any) -> None:
    try:
        assert parse_infer(orjson.dumps(body), S) is not None
    except REFUSED as exc:
        assert exc.message  # named, not a bare failure


@FAST
@given(body=json_values, inputs=json_values, dims=json_values)
def test_any_json_as_an_embeddings_body_is_answered_or_named(
    body: Any, inputs: Any, dims: Any
) -> None:
    for b in (
        body,
        {"model": "m", "input": inputs},
        {"model": "m", "input": "x", "dimensions": dims},
    ):
        try:
            assert parse_embeddings(orjson.dumps(b), S) is not None
        except REFUSED as exc:
            assert exc.message


@FAST
@given(obj=json_values, body=json_values, endpoint=st.sampled_from(bw.ENDPOINTS))
def test_any_json_as_a_batch_line_is_answered_or_named(obj: Any, body: Any, endpoint: str) -> None:
    line = {"custom_id": "c", "method": "POST", "url": endpoint, "body": body}
    for value in (obj, line):
        try:
            bw.parse_line(value, 1, endpoint)
        except REFUSED as exc:
            assert exc.field is None or exc.field.startswith("line 1")
