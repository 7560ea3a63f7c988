"""ingest/kserve/wire.py: the Open Inference Protocol v2 request and answer, pure."""

from __future__ import annotations

import struct
from array import array

import orjson
import pytest

from core.config import Settings
from core.errors import InvalidInput
from ingest.kserve.wire import (
    decode_bytes_tensor,
    encode_bytes_tensor,
    infer_answer,
    model_metadata,
    parse_infer,
    tier_for_priority,
)

S = Settings()


def text_tensor(data: list[str], shape: list[int] | None = None) -> dict[str, object]:
    return {"name": "text", "datatype": "BYTES", "shape": shape or [len(data)], "data": data}


def test_json_texts() -> None:
    r = parse_infer(orjson.dumps({"id": "r1", "inputs": [text_tensor(["a", "b"])]}), None, S)
    assert r.texts == ["a", "b"] and r.id == "r1"
    assert r.priority == 0 and r.timeout_ms is None and not r.binary_default


def test_nested_data_and_n_by_1_shape() -> None:
    body = {"inputs": [text_tensor([["a"], ["b"]], [2, 1])]}  # type: ignore[list-item]
    assert parse_infer(orjson.dumps(body), None, S).texts == ["a", "b"]


def test_binary_texts_after_the_json_header() -> None:
    blob = encode_bytes_tensor(["héllo".encode(), b"x"])
    head = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "datatype": "BYTES",
                    "shape": [2],
                    "parameters": {"binary_data_size": len(blob)},
                }
            ],
            "parameters": {"binary_data_output": True, "priority": 2, "timeout": 1_500_001},
        }
    )
    r = parse_infer(head + blob, str(len(head)), S)
    assert r.texts == ["héllo", "x"]
    assert r.binary_default and r.priority == 2
    assert r.timeout_ms == 1501  # microseconds, rounded up to whole milliseconds


def test_bytes_tensor_round_trip_and_damage() -> None:
    items = [b"", b"abc", bytes(range(256))]
    assert decode_bytes_tensor(encode_bytes_tensor(items), "t") == items
    with pytest.raises(InvalidInput):
        decode_bytes_tensor(b"\x05\x00\x00\x00ab", "t")
    with pytest.raises(InvalidInput):
        decode_bytes_tensor(b"\x01\x00", "t")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"inputs": []}, "inputs"),
        ({"inputs": [text_tensor(["a"]), text_tensor(["b"])]}, "inputs"),
        ({"inputs": [{**text_tensor(["a"]), "name": "INPUT0"}]}, "inputs[0].name"),
        ({"inputs": [{**text_tensor(["a"]), "datatype": "FP32"}]}, "inputs[0].datatype"),
        ({"inputs": [text_tensor(["a"], [1, 2])]}, "inputs[0].shape"),
        ({"inputs": [text_tensor(["a"], [0])]}, "inputs[0].shape"),
        ({"inputs": [text_tensor(["a"], [2])]}, "inputs[0]"),
        ({"inputs": [{**text_tensor(["a"]), "data": [1]}]}, "inputs[0].data"),
        ({"inputs": [text_tensor(["a"])], "parameters": {"timeout": -1}}, "parameters.timeout"),
        ({"inputs": [text_tensor(["a"])], "parameters": {"timeout": 0}}, "parameters.timeout"),
        ({"inputs": [text_tensor(["a"])], "parameters": {"priority": "1"}}, "parameters.priority"),
        ({"inputs": [text_tensor(["a"])], "id": 3}, "id"),
    ],
)
def test_bad_requests_name_the_field(body: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as e:
        parse_infer(orjson.dumps(body), None, S)
    assert e.value.field == field


def test_a_header_length_that_lies_is_400() -> None:
    raw = orjson.dumps({"inputs": [text_tensor(["a"])]})
    with pytest.raises(InvalidInput):
        parse_infer(raw, str(len(raw) + 1), S)
    with pytest.raises(InvalidInput):  # bytes that belong to no tensor
        parse_infer(raw + b"junk", str(len(raw)), S)
    with pytest.raises(InvalidInput):
        parse_infer(raw, "-3", S)


def test_priority_lowers_a_tier_never_raises_it() -> None:
    assert tier_for_priority("paid", 0) == "paid"
    assert tier_for_priority("paid", 1) == "paid"  # asked enterprise: not above the key
    assert tier_for_priority("paid", 3) == "free"
    assert tier_for_priority("enterprise", 1) == "enterprise"
    assert tier_for_priority("enterprise", 2) == "paid"
    assert tier_for_priority("enterprise", 99) == "free"
    assert tier_for_priority("free", 1) == "free"


def _req(outputs: dict[str, bool] | None = None, binary: bool = False) -> object:
    head = {"id": "q", "inputs": [text_tensor(["a", "b"])], "parameters": {}}
    if outputs is not None:
        head["outputs"] = [
            {"name": n, "parameters": {"binary_data": b}} for n, b in outputs.items()
        ]
    if binary:
        head["parameters"] = {"binary_data_output": True}
    return parse_infer(orjson.dumps(head), None, S)


def test_fp32_json_answer() -> None:
    vecs = [array("f", [1.0, 2.0]), array("f", [3.0, 4.0])]
    body, n = infer_answer(_req(), model="m", version="1", vectors=vecs, outputs=None)  # type: ignore[arg-type]
    assert n is None
    a = orjson.loads(body)
    assert a["id"] == "q" and a["model_name"] == "m" and a["model_version"] == "1"
    assert a["outputs"] == [
        {"name": "embedding", "datatype": "FP32", "shape": [2, 2], "data": [1.0, 2.0, 3.0, 4.0]}
    ]


@pytest.mark.parametrize("how", ["output", "request"])
def test_fp32_binary_answer(how: str) -> None:
    vecs = [array("f", [1.0, 2.0]), array("f", [3.0, -4.0])]
    req = _req({"embedding": True}) if how == "output" else _req(binary=True)
    body, n = infer_answer(req, model="m", version="1", vectors=vecs, outputs=None)  # type: ignore[arg-type]
    assert n is not None
    head = orjson.loads(body[:n])
    t = head["outputs"][0]
    assert "data" not in t and t["parameters"]["binary_data_size"] == 16
    assert struct.unpack("<4f", body[n:]) == (1.0, 2.0, 3.0, -4.0)


def test_bytes_answer_for_a_model_without_vectors() -> None:
    outs = [{"digest": "ab", "chars": 1}, {"digest": "cd", "chars": 1}]
    body, n = infer_answer(_req(), model="sim", version="1", vectors=None, outputs=outs)  # type: ignore[arg-type]
    t = orjson.loads(body)["outputs"][0]
    assert n is None and t["datatype"] == "BYTES" and t["shape"] == [2]
    assert [orjson.loads(x) for x in t["data"]] == outs
    body, n = infer_answer(_req(binary=True), model="sim", version="1", vectors=None, outputs=outs)  # type: ignore[arg-type]
    assert n is not None
    assert [orjson.loads(x) for x in decode_bytes_tensor(body[n:], "t")] == outs


def test_metadata() -> None:
    m = model_metadata("e", ["1"], 384)
    assert m["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert m["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]
    assert model_metadata("sim", ["1"], None)["outputs"][0]["datatype"] == "BYTES"
