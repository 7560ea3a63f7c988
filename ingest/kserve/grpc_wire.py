"""KServe's open inference protocol over gRPC, on the wire: its messages (the stubs
``tritonclient.grpc`` ships, generated from Triton's grpc_service.proto) to and from
what the HTTP door reads and answers (ingest/kserve/wire.py), and Gristmill's errors
as gRPC statuses. Pure: no I/O.

A request carries one input ``text``, BYTES, shape ``[N]`` or ``[N, 1]``, its
elements in ``raw_input_contents[0]`` (each a little-endian uint32 length and its
bytes, as tritonclient sends) or in ``contents.bytes_contents``. The answer's one
output goes in ``raw_output_contents`` (as Triton answers): an embedding model's
``embedding``, FP32 ``[N, dim]`` little-endian; any other's ``output``, BYTES ``[N]``,
each its JSON answer. Parameters ``priority`` and ``timeout`` (microseconds) mean what
they mean over HTTP; others are ignored, as there.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from typing import Any

import grpc
import orjson
from tritonclient.grpc import service_pb2 as pb

from core.config import Settings
from core.errors import GristmillError, InvalidInput
from core.limits import shown
from ingest.kserve.wire import (
    EMBEDDING_OUTPUT,
    INPUT_NAME,
    JSON_OUTPUT,
    V2Request,
    decode_bytes_tensor,
    encode_bytes_tensor,
    le_f32,
    tensor_count,
    texts_of,
    timeout_of,
)

# HTTP statuses as gRPC codes (https://grpc.github.io/grpc/core/md_doc_statuscodes.html).
# A client's mistake is never INTERNAL; 413 is what gRPC itself answers a message over
# its size limit (RESOURCE_EXHAUSTED).
_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
# Typed contents a BYTES tensor must not carry (its elements go in bytes_contents).
_OTHER_CONTENTS = (
    "bool_contents",
    "int_contents",
    "int64_contents",
    "uint_contents",
    "uint64_contents",
    "fp32_contents",
    "fp64_contents",
)
# Left of a gRPC deadline for the answer to travel back: the pipeline's own 504 (which
# names the request ids) comes before the transport's DEADLINE_EXCEEDED.
DEADLINE_MARGIN_MS = 50


def grpc_status(err: GristmillError) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """``err`` as a gRPC status: its code, its message (the ``field`` it names kept), and
    trailing metadata: the error's code and field, its headers (RateLimit-*), and when to
    retry (``retry-after`` in s, as over HTTP, and gRPC's ``grpc-retry-pushback-ms``,
    which a client's retry policy obeys)."""
    code = _CODES.get(err.status, grpc.StatusCode.INTERNAL)
    meta: list[tuple[str, str]] = [("gristmill-error-code", err.code)]
    if err.field is not None:
        meta.append(("gristmill-error-field", _ascii(err.field)))
    meta += [(k.lower(), _ascii(v)) for k, v in err.headers.items()]
    if err.retry_after_s is not None:
        s = max(1, math.ceil(err.retry_after_s))
        meta += [("retry-after", str(s)), ("grpc-retry-pushback-ms", str(s * 1000))]
    return code, err.message, tuple(meta)


def _ascii(value: str) -> str:
    # Metadata values are printable ASCII; a field may name what the caller sent.
    return value.encode("ascii", "backslashreplace").decode("ascii")


def _param(params: Any, name: str) -> int | None:
    """An integer request parameter (int64 or uint64, as clients send it), or None."""
    if name not in params:
        return None
    p = params[name]
    kind = p.WhichOneof("parameter_choice")
    if kind not in ("int64_param", "uint64_param") or getattr(p, kind) < 0:
        raise InvalidInput(
            f"parameters.{name} must be a non-negative integer, got {kind or 'nothing'}",
            field=f"parameters.{name}",
        )
    value: int = getattr(p, kind)
    return value


def _items(m: pb.ModelInferRequest) -> list[bytes]:
    """The BYTES elements of the one input, from either place the protocol puts them."""
    contents = m.inputs[0].contents
    for other in _OTHER_CONTENTS:
        if len(getattr(contents, other)):
            raise InvalidInput(
                f"inputs[0].contents.{other} is set; a BYTES tensor's elements go in "
                "bytes_contents or raw_input_contents",
                field=f"inputs[0].contents.{other}",
            )
    if m.raw_input_contents:
        if len(m.raw_input_contents) != 1:
            raise InvalidInput(
                f"raw_input_contents holds {len(m.raw_input_contents)} tensors; the request "
                "has one input",
                field="raw_input_contents",
            )
        if len(contents.bytes_contents):
            raise InvalidInput(
                "inputs[0] has both contents.bytes_contents and raw_input_contents; send one",
                field="raw_input_contents",
            )
        return decode_bytes_tensor(m.raw_input_contents[0], "raw_input_contents[0]")
    return list(contents.bytes_contents)


def parse_model_infer(
    m: pb.ModelInferRequest, settings: Settings, deadline_ms: float | None = None
) -> V2Request:
    """A ModelInfer request as the HTTP door's parsed request. ``deadline_ms``: what is
    left of the call's gRPC deadline, the request's deadline when its ``timeout``
    parameter sets none (within the bounds a timeout may take)."""
    if len(m.inputs) != 1:
        raise InvalidInput(
            f"inputs must hold exactly one tensor, {INPUT_NAME!r} (BYTES), got {len(m.inputs)}",
            field="inputs",
        )
    tensor = m.inputs[0]
    if tensor.name != INPUT_NAME:
        raise InvalidInput(
            f"unknown input {shown(tensor.name)}; the model takes {INPUT_NAME!r}",
            field="inputs[0].name",
        )
    n = tensor_count(tensor.datatype, list(tensor.shape), "inputs[0]")
    texts = texts_of(_items(m), n, "inputs[0]")
    priority = _param(m.parameters, "priority") or 0
    timeout_us = _param(m.parameters, "timeout")
    timeout_ms: int | None = None
    timeout_field = "parameters.timeout"
    if timeout_us is not None:
        timeout_ms = timeout_of(timeout_us, settings)
    elif deadline_ms is not None:
        left = int(deadline_ms) - DEADLINE_MARGIN_MS
        timeout_ms = min(settings.max_timeout_ms, max(settings.min_timeout_ms, left))
        timeout_field = "grpc-timeout"
    return V2Request(
        id=m.id or None,
        texts=texts,
        outputs={o.name: True for o in m.outputs},
        priority=priority,
        timeout_ms=timeout_ms,
        timeout_field=timeout_field,
    )


def infer_response(
    req: V2Request,
    *,
    model: str,
    version: str,
    vectors: list[array[float]] | None,
    outputs: Sequence[Any] | None,
) -> pb.ModelInferResponse:
    """The answer: ``vectors`` (an embedding model's FP32 rows) or ``outputs`` (each
    input's JSON answer, BYTES), in ``raw_output_contents`` as Triton answers."""
    if vectors is not None:
        dim = len(vectors[0]) if vectors else 0
        tensor = pb.ModelInferResponse.InferOutputTensor(
            name=EMBEDDING_OUTPUT, datatype="FP32", shape=[len(vectors), dim]
        )
        raw = le_f32(vectors)
    else:
        assert outputs is not None
        items = [orjson.dumps(o) for o in outputs]
        tensor = pb.ModelInferResponse.InferOutputTensor(
            name=JSON_OUTPUT, datatype="BYTES", shape=[len(items)]
        )
        raw = encode_bytes_tensor(items)
    return pb.ModelInferResponse(
        model_name=model,
        model_version=version,
        id=req.id or "",
        outputs=[tensor],
        raw_output_contents=[raw],
    )


def _tensors(tensors: list[dict[str, Any]]) -> list[pb.ModelMetadataResponse.TensorMetadata]:
    return [
        pb.ModelMetadataResponse.TensorMetadata(
            name=t["name"], datatype=t["datatype"], shape=t["shape"]
        )
        for t in tensors
    ]


def metadata_response(meta: dict[str, Any]) -> pb.ModelMetadataResponse:
    """The HTTP door's model metadata (wire.model_metadata) as gRPC's message."""
    return pb.ModelMetadataResponse(
        name=meta["name"],
        versions=meta["versions"],
        platform=meta["platform"],
        inputs=_tensors(meta["inputs"]),
        outputs=_tensors(meta["outputs"]),
    )
