"""ingest/openai/wire.py: OpenAI's embeddings request and answers, pure."""

from __future__ import annotations

import base64
import math
import struct
from array import array

import orjson
import pytest

from core.config import Settings
from core.errors import InvalidInput, SchemaViolation
from ingest.acceptance.prefer import Prefer, parse_prefer
from ingest.openai.wire import (
    MAX_INPUTS,
    EncodingFormat,
    check_dimensions,
    embedding,
    embeddings_answer,
    encoded,
    models_answer,
    parse_embeddings,
    parse_inputs,
    prompt_tokens,
    shortened,
    stored_vector,
)

S = Settings()


def parse(body: object) -> object:
    return parse_embeddings(orjson.dumps(body), S)


def test_a_string_is_one_input_and_float_is_the_default() -> None:
    r = parse({"model": "m", "input": "hello"})
    assert r.inputs == ["hello"]
    assert r.encoding is EncodingFormat.FLOAT
    assert r.dimensions is None and r.user is None and r.timeout_ms is None


def test_an_array_of_strings_keeps_its_order() -> None:
    r = parse({"model": "m", "input": ["b", "a", "c"], "encoding_format": "base64", "user": "u1"})
    assert r.inputs == ["b", "a", "c"]
    assert r.encoding is EncodingFormat.BASE64
    assert r.user == "u1"


@pytest.mark.parametrize("ids", [[1, 2, 3], [[1, 2], [3]]])
def test_token_ids_are_refused_saying_how_to_send_text(ids: object) -> None:
    with pytest.raises(InvalidInput) as e:
        parse_inputs(ids)
    assert e.value.field == "input"
    assert "send the text as a string or an array of strings" in e.value.message


def test_token_ids_after_a_string_name_the_item() -> None:
    with pytest.raises(InvalidInput) as e:
        parse_inputs(["text", [1, 2]])
    assert e.value.field == "input[1]"


@pytest.mark.parametrize(
    ("value", "field"),
    [([], "input"), (None, "input"), ({"a": 1}, "input"), (["a", 3.5], "input[1]")],
)
def test_bad_inputs_name_the_field(value: object, field: str) -> None:
    with pytest.raises(InvalidInput) as e:
        parse_inputs(value)
    assert e.value.field == field


def test_at_most_2048_inputs() -> None:
    assert len(parse_inputs(["x"] * MAX_INPUTS)) == MAX_INPUTS
    with pytest.raises(InvalidInput) as e:
        parse_inputs(["x"] * (MAX_INPUTS + 1))
    assert "2048" in e.value.message


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": "m", "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "m", "input": "x", "dimensions": 0}, "dimensions"),
        ({"model": "m", "input": "x", "dimensions": True}, "dimensions"),
        ({"model": "m", "input": "x", "dimensions": "8"}, "dimensions"),
        ({"model": "m", "input": "x", "user": 7}, "user"),
        ({"model": "m", "input": "x", "user": "a\x00"}, "user"),
        ({"model": "m", "input": "x", "user": "u" * 257}, "user"),
        ({"model": "m", "input": "x", "timeout_ms": 0}, "timeout_ms"),
        ({"model": "m", "input": "x", "stream": True}, "stream"),
        ({"model": "", "input": "x"}, "model"),
        ({"model": 3, "input": "x"}, "model"),
    ],
)
def test_bad_fields_are_400_naming_them(body: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as e:
        parse(body)
    assert e.value.field == field


@pytest.mark.parametrize("raw", [b"", b"  ", b"{", b"[1]", b'"s"'])
def test_bad_json_is_400(raw: bytes) -> None:
    with pytest.raises(InvalidInput):
        parse_embeddings(raw, S)


@pytest.mark.parametrize("missing", ["model", "input"])
def test_a_missing_required_field_is_422(missing: str) -> None:
    body = {"model": "m", "input": "x"}
    del body[missing]
    with pytest.raises(SchemaViolation) as e:
        parse(body)
    assert e.value.field == missing


def test_dimensions_may_shorten_never_lengthen() -> None:
    check_dimensions(None, 384, "m")
    check_dimensions(384, 384, "m")
    check_dimensions(8, 384, "m")
    with pytest.raises(InvalidInput) as e:
        check_dimensions(385, 384, "m")
    assert e.value.field == "dimensions"


def test_shortened_vectors_are_renormalised() -> None:
    v = array("f", [3.0, 4.0, 12.0])
    assert shortened(v, None) is v
    assert shortened(v, 3) is v
    short = shortened(v, 2)
    assert list(short) == pytest.approx([0.6, 0.8])
    assert math.sqrt(sum(x * x for x in short)) == pytest.approx(1.0)
    assert list(shortened(array("f", [0.0, 0.0, 1.0]), 2)) == [0.0, 0.0]


def test_base64_is_little_endian_float32() -> None:
    v = array("f", [1.0, -2.5, 0.125])
    text = encoded(v, EncodingFormat.BASE64)
    assert isinstance(text, str)
    assert struct.unpack("<3f", base64.b64decode(text)) == (1.0, -2.5, 0.125)
    assert encoded(v, EncodingFormat.FLOAT) == [1.0, -2.5, 0.125]


def test_stored_vector_from_json_or_bytes() -> None:
    assert list(stored_vector({"output": [0.5, 1, -2.0]})) == [0.5, 1.0, -2.0]
    raw = struct.pack("<2f", 0.25, 4.0)
    assert list(stored_vector({"output": None, "output_vector": raw})) == [0.25, 4.0]
    with pytest.raises(ValueError):
        stored_vector({"output": {"digest": "ab", "chars": 2}})


def test_stored_bytes_are_the_answer_unless_shortened() -> None:
    raw = struct.pack("<3f", 0.6, 0.8, 0.0)
    row = {"output": None, "output_vector": raw}
    assert embedding(row, EncodingFormat.BASE64, None) == base64.b64encode(raw).decode()
    assert embedding(row, EncodingFormat.BASE64, 3) == base64.b64encode(raw).decode()
    assert embedding(row, EncodingFormat.FLOAT, None) == list(struct.unpack("<3f", raw))
    short = embedding(row, EncodingFormat.FLOAT, 1)  # shortened, then unit length again
    assert short == [1.0]


def test_the_answer_has_openais_shape_in_input_order() -> None:
    rows = [{"output": [1.0, 0.0]}, {"output": [0.0, 1.0]}]
    a = embeddings_answer(
        rows, model="m@1", encoding=EncodingFormat.FLOAT, dimensions=None, tokens=7
    )
    assert a == {
        "object": "list",
        "data": [
            {"object": "embedding", "index": 0, "embedding": [1.0, 0.0]},
            {"object": "embedding", "index": 1, "embedding": [0.0, 1.0]},
        ],
        "model": "m@1",
        "usage": {"prompt_tokens": 7, "total_tokens": 7},
    }


def test_prompt_tokens_counts_the_ids_the_model_ran() -> None:
    assert prompt_tokens({"text": "hi there", "ids": "\x65\x66\x67\x68"}) == 4
    assert prompt_tokens("three words here") == 3


def test_models_answer_speaks_both_shapes() -> None:
    listing = [
        {"model": "sim", "version": "1", "live": True},
        {"model": "sim", "version": "2", "live": False},
    ]
    a = models_answer(listing)
    assert a["object"] == "list"
    assert a["models"] == listing
    assert [d["id"] for d in a["data"]] == ["sim", "sim@1", "sim@2"]
    assert all(d["object"] == "model" and d["owned_by"] for d in a["data"])


def test_models_answer_lists_no_retired_version() -> None:
    listing = [
        {"model": "sim", "version": "1", "state": "retired"},
        {"model": "sim", "version": "2", "state": "live"},
        {"model": "old", "version": "1", "state": "retired"},
    ]
    a = models_answer(listing)
    assert [d["id"] for d in a["data"]] == ["sim", "sim@2"]
    assert a["models"] == listing  # Gristmill's own list shows every state


@pytest.mark.parametrize(
    ("headers", "want"),
    [
        ([], Prefer(False, None)),
        (["respond-async"], Prefer(True, None)),
        (["respond-async, wait=5"], Prefer(True, 5)),
        (["wait=10", "respond-async"], Prefer(True, 10)),
        (['RESPOND-ASYNC;foo=bar, wait="3"'], Prefer(True, 3)),
        (["return=minimal, wait=abc"], Prefer(False, None)),
    ],
)
def test_prefer(headers: list[str], want: Prefer) -> None:
    assert parse_prefer(headers) == want
