"""Partial answers at the deadline (decision 63): their shape, their Location, and that
OpenAI's SDK reads them as an ordinary answer. Pure; the route runs in
tests/unit/ingest/acceptance/test_front_doors.py and tests/e2e/test_partial_embeddings.py."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from openai.types import CreateEmbeddingResponse

from core.errors import InvalidInput
from core.messages import KEEP_UNTIL, RequestMessage, keep_until
from ingest.acceptance.message import kept_until
from ingest.acceptance.prefer import Prefer, parse_prefer
from ingest.openai.partial import (
    MISSING_HEADER,
    RestQuery,
    parse_rest_query,
    partial_answer,
    partial_headers,
    rest_location,
)
from results.requests import AnswerRow
from results.vectors import EncodingFormat, from_floats, to_base64
from tests.unit.ingest.stubs import answer_row

FIRST = "0b5c0f7e-4f3a-4a39-9c53-6f0c3f6e2a11"
WHERE = f"/v1/embeddings/{FIRST}?inputs=3"


def row(values: list[float]) -> AnswerRow:
    msg = RequestMessage(FIRST, "t", "paid", "m", "1", "x", {}, 1.0, 0.0)
    return answer_row(msg, vector=from_floats(values))


def answer(rows: list[AnswerRow | None], **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "model": "m@1",
        "encoding": EncodingFormat.FLOAT,
        "dimensions": None,
        "tokens": 7,
        "location": WHERE,
    }
    return partial_answer(rows, **{**args, **kw})


def test_the_done_inputs_keep_their_index_and_the_missing_are_counted() -> None:
    body = answer([row([1.0, 0.0]), None, row([0.0, 1.0])])
    assert [d["index"] for d in body["data"]] == [0, 2]
    assert body["data"][1]["embedding"] == [0.0, 1.0]
    assert body["partial"] == {"done": 2, "missing": 1, "total": 3, "location": WHERE}
    assert body["usage"] == {"prompt_tokens": 7, "total_tokens": 7}


def test_a_complete_answer_has_no_partial_field_and_none_done_has_empty_data() -> None:
    full = answer([row([1.0]), row([0.5])])
    assert "partial" not in full and [d["index"] for d in full["data"]] == [0, 1]
    empty = answer([None, None])
    assert empty["data"] == [] and empty["partial"]["missing"] == 2


def test_without_the_inputs_at_hand_there_is_no_usage() -> None:
    assert "usage" not in answer([row([1.0]), None], tokens=None)


def test_the_openai_sdk_reads_a_partial_answer() -> None:
    """Its model of the answer (the SDK decodes base64 before it: tests/e2e does that)."""
    parsed = CreateEmbeddingResponse.model_validate(answer([None, row([0.6, 0.8])]))
    assert [d.index for d in parsed.data] == [1]
    assert parsed.data[0].embedding == pytest.approx([0.6, 0.8])
    assert (parsed.model_extra or {})["partial"]["missing"] == 1
    b64 = answer([None, row([0.6, 0.8])], encoding=EncodingFormat.BASE64)
    assert b64["data"][0]["embedding"] == to_base64(from_floats([0.6, 0.8]))


def test_the_location_round_trips_through_its_query() -> None:
    cases = [
        (3, EncodingFormat.FLOAT, None),
        (2048, EncodingFormat.BASE64, 64),
    ]
    for n, enc, dims in cases:
        loc = rest_location(FIRST, n, enc, dims)
        url = urlsplit(loc)
        assert url.path == f"/v1/embeddings/{FIRST}"
        assert parse_rest_query(dict(parse_qsl(url.query))) == RestQuery(n, enc, dims)
    assert rest_location(FIRST, 3, EncodingFormat.FLOAT, None) == WHERE


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({}, "inputs"),
        ({"inputs": "0"}, "inputs"),
        ({"inputs": "2049"}, "inputs"),
        ({"inputs": "-1"}, "inputs"),
        ({"inputs": "٣"}, "inputs"),  # a digit to str.isdigit, not to us
        ({"inputs": "9" * 40}, "inputs"),
        ({"inputs": "2", "encoding_format": "int8"}, "encoding_format"),
        ({"inputs": "2", "dimensions": "x"}, "dimensions"),
    ],
)
def test_a_bad_location_query_is_a_400_naming_the_parameter(
    query: dict[str, str], field: str
) -> None:
    with pytest.raises(InvalidInput) as e:
        parse_rest_query(query)
    assert e.value.field == field


def test_the_headers_say_what_is_missing_and_where() -> None:
    h = partial_headers(5, WHERE)
    assert h == {MISSING_HEADER: "5", "Location": WHERE, "Preference-Applied": "partial-results"}


def test_prefer_partial_results_is_read_beside_the_others() -> None:
    assert parse_prefer(["partial-results"]) == Prefer(partial=True)
    assert parse_prefer(["respond-async, Partial-Results"]) == Prefer(True, None, True)
    assert parse_prefer(["partial"]) == Prefer()  # not ours: ignored (RFC 7240)


def test_the_rest_is_kept_as_long_as_any_sync_request_may_wait() -> None:
    assert kept_until(100.0, 102.0, 300_000) == 400.0
    assert kept_until(100.0, 500.0, 300_000) == 500.0  # never before its own deadline
    assert keep_until({KEEP_UNTIL: 400.0}) == 400.0 and keep_until({KEEP_UNTIL: 400}) == 400.0
    for bad in (None, "400", True, float("nan"), float("inf"), -1.0):
        assert keep_until({KEEP_UNTIL: bad}) is None
    assert keep_until({}) is None
