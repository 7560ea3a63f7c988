"""core/limits.py: what Kafka and PostgreSQL cannot carry is refused, naming the field."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import InvalidInput
from core.limits import (
    INT32_MAX,
    UINT64_MAX,
    canonical_uuid,
    check_header_token,
    check_int,
    check_json,
    check_object,
    check_text,
    shown,
)


def refused(fn: Any, *args: Any, **kwargs: Any) -> InvalidInput:
    with pytest.raises(InvalidInput) as info:
        fn(*args, **kwargs)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize(
    "value,what",
    [
        ("a\x00b", "U+0000"),
        ("\x00", "U+0000"),
        ("a\ud800", "surrogate"),
        ("\udfff tail", "surrogate"),
    ],
)
def test_text_that_postgres_refuses_is_400_naming_the_field(value: str, what: str) -> None:
    err = refused(check_text, value, "input")
    assert err.field == "input" and what in err.message


def test_text_length_cap_names_the_limit() -> None:
    err = refused(check_text, "x" * 11, "params.salt", max_chars=10)
    assert err.field == "params.salt" and "at most 10" in err.message
    assert check_text("x" * 10, "params.salt", max_chars=10) == "x" * 10


@pytest.mark.parametrize(
    "value", ["", "plain", "\u00e9\u4e2d\U0001f600", "\x01\x7f\u009f", "\uffff"]
)
def test_storable_text_passes_unchanged(value: str) -> None:
    assert check_text(value, "input") == value


@pytest.mark.parametrize(
    "value,field",
    [
        ({"a": {"b": "x\x00"}}, "metadata.a.b"),
        ({"a": [1, "ok", "\ud800"]}, "metadata.a[2]"),
        ({"a": math.nan}, "metadata.a"),
        ({"a": -math.inf}, "metadata.a"),
        ({"a": UINT64_MAX + 1}, "metadata.a"),
        ({"a": -(2**63) - 1}, "metadata.a"),
        ({"k\x00": 1}, "metadata"),
        ({"ok": {"\ud800": 1}}, "metadata.ok"),
        ({"a": b"bytes"}, "metadata.a"),
    ],
)
def test_json_walk_finds_the_bad_value_and_names_its_path(value: Any, field: str) -> None:
    assert refused(check_json, value, "metadata", max_depth=8).field == field


def test_json_depth_is_capped_without_recursion() -> None:
    deep: Any = "leaf"
    for _ in range(100_000):  # far past Python's recursion limit: the walk is iterative
        deep = [deep]
    err = refused(check_json, deep, "input", max_depth=32)
    assert "deeper than 32" in err.message
    shallow: Any = "leaf"
    for _ in range(32):
        shallow = [shallow]
    check_json(shallow, "input", max_depth=32)


def test_a_hostile_key_is_quoted_short_in_paths_and_messages() -> None:
    key = "k" * 10_000
    err = refused(check_json, {key: "\x00"}, "metadata", max_depth=4)
    assert len(err.field or "") < 100 and len(err.message) < 300


def test_object_size_is_measured_as_json() -> None:
    assert check_object({"a": "x"}, "params", max_bytes=9, max_depth=4) == 9
    err = refused(check_object, {"a": "xx"}, "params", max_bytes=9, max_depth=4)
    assert err.field == "params" and "at most 9" in err.message


@pytest.mark.parametrize("value", [0, -1, INT32_MAX + 1])
def test_int_range(value: int) -> None:
    assert refused(check_int, value, "cursor", lo=1, hi=INT32_MAX).field == "cursor"


@pytest.mark.parametrize("value", ["", "k" * 256, "a\x00", "caf\u00e9", "tab\there", "\x7f"])
def test_header_tokens_are_visible_ascii_within_the_cap(value: str) -> None:
    err = refused(check_header_token, value, "Idempotency-Key", max_chars=255)
    assert err.field == "Idempotency-Key"


def test_header_token_accepts_the_usual_keys() -> None:
    for key in ("k" * 255, "8e03978e-40d5-43e8-bc93-6894a57f9324", "order 42 / retry"):
        assert check_header_token(key, "Idempotency-Key", max_chars=255) == key


@pytest.mark.parametrize(
    "value",
    [
        "urn:uuid:12345678-1234-1234-1234-123456789abc",
        "{12345678-1234-1234-1234-123456789abc}",
        "12345678123412341234123456789abc",
        "12345678-1234-1234-1234-123456789abcd",
        "12345678-1234-1234-1234-123456789ab\x00",
        "1234567g-1234-1234-1234-123456789abc",
        "",
    ],
)
def test_only_canonical_uuids_are_ids(value: str) -> None:
    assert canonical_uuid(value) is None


def test_canonical_uuid_is_lowered() -> None:
    assert canonical_uuid("ABCDEF01-1234-1234-1234-123456789ABC") == (
        "abcdef01-1234-1234-1234-123456789abc"
    )


def test_shown_escapes_and_truncates() -> None:
    assert shown("a\x00") == "'a\\x00'"
    assert len(shown("x" * 1000)) == 64


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_whatever_passes_the_walk_orjson_can_write_and_read_back(value: Any) -> None:
    try:
        check_json(value, "v", max_depth=32)
    except InvalidInput:
        return
    assert orjson.loads(orjson.dumps(value)) == value
