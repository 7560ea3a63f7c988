"""ingest/kserve/grpc_wire.py: ModelInfer's messages to and from the HTTP door's parsed
request and answer, and errors as gRPC statuses. Pure."""

from __future__ import annotations

import struct
from array import array

import grpc
import numpy as np
import orjson
import pytest
import tritonclient.grpc as tg
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import deserialize_bytes_tensor

from core.config import Settings
from core.errors import (
    DeadlineExceeded,
    GristmillError,
    IdempotencyConflict,
    InvalidInput,
    ModelError,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    Unauthorized,
    Unavailable,
)
from ingest.kserve.grpc_wire import (
    DEADLINE_MARGIN_MS,
    grpc_status,
    infer_response,
    metadata_response,
    parse_model_infer,
)
from ingest.kserve.wire import MAX_INPUTS, V2Request, encode_bytes_tensor, model_metadata

S = Settings()


def client_request(texts: list[bytes], **kw: object) -> pb.ModelInferRequest:
    """What tritonclient.grpc itself sends for BYTES input (raw_input_contents)."""
    inp = tg.InferInput("text", [len(texts)], "BYTES")
    inp.set_data_from_numpy(np.array(texts, dtype=np.object_))
    outputs = [tg.InferRequestedOutput("embedding")]
    return tg._utils._get_inference_request(  # the client's own request builder
        model_name="sim",
        inputs=[inp],
        model_version="",
        request_id="r1",
        outputs=outputs,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=kw.get("priority", 0),
        timeout=kw.get("timeout"),
        parameters=None,
    )


def test_what_tritonclient_sends_parses_as_over_http() -> None:
    r = parse_model_infer(
        client_request([b"a", "h\xe9".encode()], priority=2, timeout=2_500_000), S
    )
    assert r.texts == ["a", "h\xe9"] and r.id == "r1" and r.outputs == {"embedding": True}
    assert r.priority == 2 and r.timeout_ms == 2500


def test_bytes_contents_and_an_n_by_1_shape() -> None:
    m = pb.ModelInferRequest(model_name="sim")
    t = m.inputs.add(name="text", datatype="BYTES", shape=[2, 1])
    t.contents.bytes_contents.extend([b"x", b"y"])
    assert parse_model_infer(m, S).texts == ["x", "y"]


def test_the_grpc_deadline_is_the_requests_when_no_timeout_is_set() -> None:
    m = client_request([b"a"])
    assert parse_model_infer(m, S).timeout_ms is None
    assert parse_model_infer(m, S, deadline_ms=3000).timeout_ms == 3000 - DEADLINE_MARGIN_MS
    assert parse_model_infer(m, S, deadline_ms=1).timeout_ms == S.min_timeout_ms
    assert parse_model_infer(m, S, deadline_ms=1e12).timeout_ms == S.max_timeout_ms
    # The timeout parameter wins over the transport's deadline.
    assert parse_model_infer(client_request([b"a"], timeout=900_000), S, 5000).timeout_ms == 900


def _bad(mutate: object) -> pb.ModelInferRequest:
    m = client_request([b"a", b"b"])
    mutate(m)  # type: ignore[operator]
    return m


@pytest.mark.parametrize(
    ("mutate", "field", "says"),
    [
        (
            lambda m: (
                m.inputs[0].ClearField("datatype") or setattr(m.inputs[0], "datatype", "FP32")
            ),
            "inputs[0].datatype",
            "must be BYTES",
        ),
        (lambda m: setattr(m.inputs[0], "name", "img"), "inputs[0].name", "unknown input"),
        (lambda m: m.inputs[0].shape.append(3), "inputs[0].shape", "[N] or [N, 1]"),
        (lambda m: m.inputs[0].shape.__setitem__(0, 3), "inputs[0]", "shape says 3"),
        (lambda m: m.inputs[0].shape.__setitem__(0, MAX_INPUTS + 1), "inputs[0].shape", "1 to"),
        (lambda m: m.inputs.add(name="text", datatype="BYTES", shape=[1]), "inputs", "exactly one"),
        (lambda m: m.raw_input_contents.append(b""), "raw_input_contents", "one input"),
        (lambda m: m.inputs[0].contents.bytes_contents.append(b"x"), "raw_input_contents", "both"),
        (
            lambda m: m.inputs[0].contents.fp32_contents.append(1.0),
            "inputs[0].contents.fp32_contents",
            "BYTES tensor",
        ),
        (
            lambda m: m.raw_input_contents.__setitem__(0, b"\x09\x00\x00\x00ab"),
            "raw_input_contents[0]",
            "runs past",
        ),
        (
            lambda m: m.raw_input_contents.__setitem__(0, encode_bytes_tensor([b"\xff", b"b"])),
            "inputs[0].data",
            "not UTF-8",
        ),
        (
            lambda m: m.parameters["priority"].__setattr__("string_param", "high"),
            "parameters.priority",
            "non-negative integer",
        ),
        (
            lambda m: m.parameters["timeout"].__setattr__("int64_param", -5),
            "parameters.timeout",
            "non-negative integer",
        ),
        (
            lambda m: m.parameters["timeout"].__setattr__("int64_param", 10**13),
            "parameters.timeout",
            "between",
        ),
    ],
)
def test_a_bad_request_is_invalid_input_naming_its_field(
    mutate: object, field: str, says: str
) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_model_infer(_bad(mutate), S)
    assert err.value.field == field and says in err.value.message


def test_an_embedding_answer_reads_back_with_as_numpy() -> None:
    rows = [array("f", [0.5, -1.0, 2.0]), array("f", [1.0, 0.0, 3.25])]
    msg = infer_response(
        V2Request("r1", ["a", "b"]), model="m", version="2", vectors=rows, outputs=None
    )
    assert (msg.model_name, msg.model_version, msg.id) == ("m", "2", "r1")
    got = tg.InferResult(msg).as_numpy("embedding")
    assert got.dtype == np.float32 and got.shape == (2, 3)
    assert got.tolist() == [[0.5, -1.0, 2.0], [1.0, 0.0, 3.25]]
    assert msg.raw_output_contents[0] == struct.pack("<6f", 0.5, -1.0, 2.0, 1.0, 0.0, 3.25)


def test_a_json_answer_is_bytes_each_its_json() -> None:
    outs = [{"label": "x"}, [1, 2]]
    msg = infer_response(
        V2Request(None, ["a", "b"]), model="m", version="1", vectors=None, outputs=outs
    )
    assert msg.outputs[0].datatype == "BYTES" and list(msg.outputs[0].shape) == [2]
    got = tg.InferResult(msg).as_numpy("output")
    assert [orjson.loads(x) for x in got] == outs
    assert list(deserialize_bytes_tensor(msg.raw_output_contents[0])) == list(got)


def test_metadata_as_the_http_door_answers_it() -> None:
    msg = metadata_response(model_metadata("m", ["1", "2"], 384))
    assert msg.name == "m" and list(msg.versions) == ["1", "2"]
    assert [(t.name, t.datatype, list(t.shape)) for t in msg.inputs] == [("text", "BYTES", [-1])]
    assert [(t.name, t.datatype, list(t.shape)) for t in msg.outputs] == [
        ("embedding", "FP32", [-1, 384])
    ]


@pytest.mark.parametrize(
    ("err", "code"),
    [
        (InvalidInput("x", field="inputs"), grpc.StatusCode.INVALID_ARGUMENT),
        (ModelError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (IdempotencyConflict("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (Unauthorized("x"), grpc.StatusCode.UNAUTHENTICATED),
        (NotFound("x"), grpc.StatusCode.NOT_FOUND),
        (PayloadTooLarge("x"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (RateLimited("x", retry_after_s=0.2), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (Unavailable("x", retry_after_s=2.5), grpc.StatusCode.UNAVAILABLE),
        (DeadlineExceeded("x"), grpc.StatusCode.DEADLINE_EXCEEDED),
        (GristmillError("a bug"), grpc.StatusCode.INTERNAL),
    ],
)
def test_statuses(err: GristmillError, code: grpc.StatusCode) -> None:
    got, message, meta = grpc_status(err)
    assert got == code and message == err.message
    assert ("gristmill-error-code", err.code) in meta
    if err.status < 500 and err.status != 429:
        assert got != grpc.StatusCode.INTERNAL


def test_retry_info_and_limit_headers_go_in_trailing_metadata() -> None:
    err = RateLimited("slow down", retry_after_s=1.2, headers={"RateLimit-Remaining": "0"})
    _, _, meta = grpc_status(err)
    assert ("retry-after", "2") in meta and ("grpc-retry-pushback-ms", "2000") in meta
    assert ("ratelimit-remaining", "0") in meta
    # A field naming what the caller sent stays printable ASCII, as metadata must.
    _, _, meta = grpc_status(InvalidInput("x", field="inputs[0].na\xefve"))
    assert ("gristmill-error-field", "inputs[0].na\\xefve") in meta
