"""Job bodies, caps and cursors (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from core.errors import InvalidInput, SchemaViolation
from ingest.jobs.schemas import (
    MAX_INDEX,
    JobBody,
    JobItem,
    check_custom_id,
    check_metadata,
    parse_index,
    validate,
)


@pytest.mark.parametrize(
    "raw", ["2147483648", "-1", "abc", "1e3", " 5", "5 ", "0x10", "١٢", "", "99999999999", "1.0"]
)
def test_malformed_or_out_of_range_cursors_are_400(raw: str) -> None:
    with pytest.raises(InvalidInput) as e:
        parse_index(raw, "cursor", default=0, low=0, high=MAX_INDEX)
    assert e.value.field == "cursor" and e.value.status == 400


def test_cursors_in_range_parse() -> None:
    assert parse_index(None, "cursor", default=0, low=0, high=MAX_INDEX) == 0
    assert parse_index("2147483647", "cursor", default=0, low=0, high=MAX_INDEX) == MAX_INDEX
    assert parse_index("007", "limit", default=1, low=1, high=1000) == 7
    with pytest.raises(InvalidInput):
        parse_index("0", "limit", default=1, low=1, high=1000)


@pytest.mark.parametrize(
    "body,field",
    [
        ({"items": []}, "model"),
        ({"model": "sim"}, "items"),
        ({"model": "sim", "items": {}}, "items"),
        ({"model": "sim", "items": [], "colour": "red"}, "colour"),
        ({"model": 5, "items": []}, "model"),
        ({"model": "sim", "items": [], "completion_window_s": "10"}, "completion_window_s"),
        ({"model": "sim", "items": [], "metadata": {"a": 1}}, "metadata.a"),
        ({"model": "sim", "items": [], "params": []}, "params"),
    ],
)
def test_wrong_shapes_are_422_naming_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(SchemaViolation) as e:
        validate(body, JobBody)
    assert e.value.field == field


def test_item_errors_name_the_item() -> None:
    with pytest.raises(SchemaViolation) as e:
        validate({"input": "x", "custom_id": ["a"]}, JobItem, "items[7]")
    assert e.value.field == "items[7].custom_id"
    with pytest.raises(SchemaViolation) as e:
        validate({}, JobItem, "line 3")
    assert e.value.field == "line 3.input" and "required" in e.value.message
    with pytest.raises(InvalidInput) as e2:
        validate("text", JobItem, "items[0]")
    assert e2.value.field == "items[0]"


def test_metadata_caps() -> None:
    check_metadata({"run": "t1"})
    check_metadata(None)
    for md, field in [
        ({f"k{i}": "v" for i in range(17)}, "metadata"),
        ({"k" * 65: "v"}, "metadata"),
        ({"k": "v" * 513}, "metadata.k"),
        ({"k": "v\x00"}, "metadata.k"),
        ({"k\x00": "v"}, "metadata"),
        ({"k": "v\ud800"}, "metadata.k"),
    ]:
        with pytest.raises(InvalidInput) as e:
            check_metadata(md)
        assert e.value.field == field


def test_custom_id_caps() -> None:
    check_custom_id("x" * 255, "items[0]")
    check_custom_id(None, "items[0]")
    with pytest.raises(InvalidInput, match="255"):
        check_custom_id("x" * 256, "items[0]")
    with pytest.raises(InvalidInput) as e:
        check_custom_id("a\x00", "line 9")
    assert e.value.field == "line 9.custom_id"
