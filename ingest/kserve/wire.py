"""The KServe Open Inference Protocol v2 (Triton's HTTP protocol) on the wire. Pure.

A request carries one input tensor ``text`` of datatype BYTES, shape ``[N]`` or
``[N, 1]``: N texts, as JSON ``data`` or in the binary tensor extension (after a JSON
header of ``Inference-Header-Content-Length`` bytes, each element a little-endian
uint32 length then its bytes). An embedding model answers the output ``embedding``,
FP32 ``[N, dim]``; any other model the output ``output``, BYTES ``[N]``, each its JSON
answer. Outputs go as JSON ``data`` or, when asked (``binary_data`` on the output or
``binary_data_output`` on the request, as tritonclient does by default), binary.

Triton's request parameters: ``timeout`` (microseconds) is the deadline; ``priority``
(1 is the highest, 0 the default) may lower the request's scheduling tier below the
key's, never raise it (decision 34). Errors are ``InvalidInput`` naming the field.

The body is parsed before the tenant's rate is checked (the rate is charged per text),
so parsing costs at most one pass over it: the body is capped (1 MB), ``data`` may nest
only as deep as the shape allows (two levels), and nothing here recurses further.
"""

from __future__ import annotations

import math
import struct
import sys
from array import array
from dataclasses import dataclass, field
from typing import Any

import orjson

from core.config import Settings
from core.errors import InvalidInput
from core.limits import ascii_decimal, check_int, shown
from core.vocab import TIERS

INPUT_NAME = "text"
EMBEDDING_OUTPUT = "embedding"
JSON_OUTPUT = "output"
HEADER_LENGTH = "Inference-Header-Content-Length"
# The most texts one request may carry: as OpenAI's embeddings (ingest/openai/wire.py).
MAX_INPUTS = 2048
# ``data`` is flat or nested as its shape is, and the shape is [N] or [N, 1].
MAX_DATA_DEPTH = 2
_U32 = struct.Struct("<I")


@dataclass(frozen=True)
class V2Request:
    id: str | None
    texts: list[str]
    # Requested outputs: name -> binary; empty: every output, ``binary_default``.
    outputs: dict[str, bool] = field(default_factory=dict)
    binary_default: bool = False
    priority: int = 0
    timeout_ms: int | None = None
    # Where the caller set it, named by a 400 when no batch could meet it: Triton's
    # parameter (us), or over gRPC the call's own deadline (grpc-timeout).
    timeout_field: str = "parameters.timeout"


def _split(raw: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    if header_length is None:
        return raw, b""
    n = ascii_decimal(header_length)
    if n is None or n > len(raw):
        raise InvalidInput(
            f"{HEADER_LENGTH} must be the JSON header's length in bytes, in ASCII digits "
            f"(at most the body's {len(raw)})",
            field=HEADER_LENGTH,
        )
    return raw[:n], raw[n:]


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInput(f"{where} must be a JSON object", field=where)
    return value


def _uint(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInput(f"{where} must be a non-negative integer", field=where)
    return value


def decode_bytes_tensor(raw: bytes, where: str) -> list[bytes]:
    """BYTES elements in the binary extension: each a little-endian uint32 length and
    that many bytes."""
    out, pos = [], 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise InvalidInput(f"{where}: a BYTES element's length is cut short", field=where)
        (n,) = _U32.unpack_from(raw, pos)
        pos += 4
        if pos + n > len(raw):
            raise InvalidInput(f"{where}: a BYTES element runs past the tensor", field=where)
        out.append(raw[pos : pos + n])
        pos += n
    return out


def encode_bytes_tensor(items: list[bytes]) -> bytes:
    return b"".join(_U32.pack(len(x)) + x for x in items)


def _flat(data: Any, where: str, depth: int = 1) -> list[Any]:
    """Row-major ``data``, flat or nested as the protocol allows (at most
    ``MAX_DATA_DEPTH`` levels, so this recurses no further)."""
    if not isinstance(data, list):
        raise InvalidInput(f"{where} must be an array", field=where)
    if depth > MAX_DATA_DEPTH:
        raise InvalidInput(
            f"{where} nests deeper than {MAX_DATA_DEPTH} levels, the depth limit of a "
            "[N] or [N, 1] tensor",
            field=where,
        )
    if data and isinstance(data[0], list):
        return [x for row in data for x in _flat(row, where, depth + 1)]
    return data


def tensor_count(datatype: Any, shape: Any, where: str) -> int:
    """The number of texts a BYTES tensor of ``shape`` holds ([N] or [N, 1]), checked."""
    if datatype != "BYTES":
        raise InvalidInput(
            f"{where}.datatype must be BYTES (text), got {shown(datatype)}",
            field=f"{where}.datatype",
        )
    if (
        not isinstance(shape, list)
        or not 1 <= len(shape) <= 2
        or any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in shape)
        or (len(shape) == 2 and shape[1] != 1)
    ):
        raise InvalidInput(
            f"{where}.shape must be [N] or [N, 1], got {shown(shape)}", field=f"{where}.shape"
        )
    n: int = shape[0]
    if not 1 <= n <= MAX_INPUTS:
        raise InvalidInput(
            f"{where}.shape: 1 to {MAX_INPUTS} texts per request, got {n}", field=f"{where}.shape"
        )
    return n


def texts_of(items: list[Any], n: int, where: str) -> list[str]:
    """A BYTES tensor's elements (UTF-8 bytes or strings) as texts: as many as its shape
    says."""
    if len(items) != n:
        raise InvalidInput(
            f"{where}: shape says {n} elements, the data holds {len(items)}", field=where
        )
    texts = []
    for i, x in enumerate(items):
        if isinstance(x, bytes):
            try:
                x = x.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidInput(
                    f"{where}[{i}] is not UTF-8 text", field=f"{where}.data"
                ) from None
        if not isinstance(x, str):
            raise InvalidInput(f"{where}.data[{i}] must be a string", field=f"{where}.data")
        texts.append(x)
    return texts


def _texts(tensor: dict[str, Any], binary: bytes, where: str) -> tuple[list[str], int]:
    """The tensor's texts and the binary bytes it used."""
    n = tensor_count(tensor.get("datatype"), tensor.get("shape"), where)
    params = _object(tensor.get("parameters", {}), f"{where}.parameters")
    size = params.get("binary_data_size")
    used = 0
    if size is not None:
        used = _uint(size, f"{where}.parameters.binary_data_size")
        if used > len(binary):
            raise InvalidInput(
                f"{where}: binary_data_size {used} exceeds the {len(binary)} bytes sent",
                field=f"{where}.parameters.binary_data_size",
            )
        items: list[Any] = decode_bytes_tensor(binary[:used], where)
    else:
        if "data" not in tensor:
            raise InvalidInput(f"{where}.data is required", field=f"{where}.data")
        items = _flat(tensor["data"], f"{where}.data")
    return texts_of(items, n, where), used


def parse_infer(raw: bytes, header_length: str | None, settings: Settings) -> V2Request:
    """``POST /v2/models/{m}/infer``'s body."""
    head, binary = _split(raw, header_length)
    try:
        data = orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}") from exc
    body = _object(data, "body")
    rid = body.get("id")
    if rid is not None and not isinstance(rid, str):
        raise InvalidInput("id must be a string", field="id")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1:
        raise InvalidInput(
            f"inputs must hold exactly one tensor, {INPUT_NAME!r} (BYTES)", field="inputs"
        )
    tensor = _object(inputs[0], "inputs[0]")
    if tensor.get("name") != INPUT_NAME:
        raise InvalidInput(
            f"unknown input {shown(tensor.get('name'))}; the model takes {INPUT_NAME!r}",
            field="inputs[0].name",
        )
    texts, used = _texts(tensor, binary, "inputs[0]")
    if used != len(binary):
        raise InvalidInput(
            f"{len(binary) - used} bytes after the JSON header belong to no tensor",
            field=HEADER_LENGTH,
        )
    asked = body.get("outputs")
    if asked is not None and not isinstance(asked, list):
        raise InvalidInput("outputs must be an array", field="outputs")
    outputs: dict[str, bool] = {}
    for i, out in enumerate(asked or []):
        out = _object(out, f"outputs[{i}]")
        name = out.get("name")
        if not isinstance(name, str):
            raise InvalidInput(f"outputs[{i}].name must be a string", field=f"outputs[{i}].name")
        oparams = _object(out.get("parameters", {}), f"outputs[{i}].parameters")
        outputs[name] = oparams.get("binary_data") is True
    params = _object(body.get("parameters", {}), "parameters")
    priority = _uint(params.get("priority", 0), "parameters.priority")
    timeout_ms = None
    if "timeout" in params:
        timeout_ms = timeout_of(_uint(params["timeout"], "parameters.timeout"), settings)
    return V2Request(
        id=rid,
        texts=texts,
        outputs=outputs,
        binary_default=params.get("binary_data_output") is True,
        priority=priority,
        timeout_ms=timeout_ms,
    )


def timeout_of(timeout_us: int, settings: Settings) -> int:
    """Triton's ``timeout`` parameter (microseconds) as the deadline in ms, in bounds."""
    timeout_ms = math.ceil(timeout_us / 1000)
    check_int(
        timeout_ms, "parameters.timeout", lo=settings.min_timeout_ms, hi=settings.max_timeout_ms
    )
    return timeout_ms


def tier_for_priority(key_tier: str, priority: int) -> str:
    """Triton's priority (1 highest, 0 the default) as a tier: level p asks for the
    p-th tier from the top (enterprise, paid, free; beyond the last, the last), and
    a key never gets a tier above its own."""
    if priority == 0:
        return key_tier
    top_down = TIERS[::-1]
    asked = top_down[min(priority, len(top_down)) - 1]
    return asked if TIERS.index(asked) < TIERS.index(key_tier) else key_tier


def output_name(embedding_dim: int | None) -> str:
    return EMBEDDING_OUTPUT if embedding_dim is not None else JSON_OUTPUT


def check_outputs(req: V2Request, name: str) -> None:
    for asked in req.outputs:
        if asked != name:
            raise InvalidInput(
                f"unknown output {shown(asked)}; the model answers {name!r}",
                field="outputs",
            )


def le_f32(vectors: list[array[float]]) -> bytes:
    flat = array("f")
    for v in vectors:
        flat.extend(v)
    if sys.byteorder == "big":
        flat.byteswap()
    return flat.tobytes()


def infer_answer(
    req: V2Request,
    *,
    model: str,
    version: str,
    vectors: list[array[float]] | None,
    outputs: list[Any] | None,
) -> tuple[bytes, int | None]:
    """The response body and, when some output is binary, its JSON header's length
    (the ``Inference-Header-Content-Length`` to send). ``vectors``: an embedding
    model's rows (FP32 output); else ``outputs``: each input's JSON answer (BYTES)."""
    name = EMBEDDING_OUTPUT if vectors is not None else JSON_OUTPUT
    binary = req.outputs.get(name, req.binary_default) if req.outputs else req.binary_default
    tensor: dict[str, Any]
    blob = b""
    if vectors is not None:
        dim = len(vectors[0]) if vectors else 0
        tensor = {"name": name, "datatype": "FP32", "shape": [len(vectors), dim]}
        if binary:
            blob = le_f32(vectors)
        else:
            tensor["data"] = [x for v in vectors for x in v.tolist()]
    else:
        assert outputs is not None
        items = [orjson.dumps(o) for o in outputs]
        tensor = {"name": name, "datatype": "BYTES", "shape": [len(items)]}
        if binary:
            blob = encode_bytes_tensor(items)
        else:
            tensor["data"] = [x.decode() for x in items]
    if binary:
        tensor["parameters"] = {"binary_data_size": len(blob)}
    answer: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": [tensor]}
    if req.id is not None:
        answer["id"] = req.id
    head = orjson.dumps(answer)
    return (head + blob, len(head)) if binary else (head, None)


def model_metadata(name: str, versions: list[str], embedding_dim: int | None) -> dict[str, Any]:
    out_name = output_name(embedding_dim)
    output = (
        {"name": out_name, "datatype": "FP32", "shape": [-1, embedding_dim]}
        if embedding_dim is not None
        else {"name": out_name, "datatype": "BYTES", "shape": [-1]}
    )
    return {
        "name": name,
        "versions": versions,
        "platform": "gristmill",
        "inputs": [{"name": INPUT_NAME, "datatype": "BYTES", "shape": [-1]}],
        "outputs": [output],
    }
