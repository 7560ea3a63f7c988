"""Vector outputs as the request log stores them and as answers carry them. Pure.

A model that answers with an array (an embedding: one float32 row per input) has each
row stored as little-endian float32 bytes in ``requests.output_vector`` (bytea): 4 bytes
a value, 1,536 for a 384-value embedding, against about 7,700 as JSON text. The same
bytes are the answer's ``base64`` encoding (as OpenAI's ``encoding_format="base64"``:
base64 of little-endian float32), so an answer is encoded once, when the row is made,
and reused for the announcement and for every reader. ``float`` answers decode them to
a JSON list. Float32 is lossless for what the models produce (float32 on CPU, float16
on GPU widened to float32); a float64 array is rounded to float32 (about 7 significant
digits). Analysts decode with ``gristmill_vector(output_vector)`` (docs/analysts.md).
See docs/decisions/0029-compact-results-and-a-partitioned-request-log.md.

numpy is not imported here: the API (which decodes) does not depend on it; rows are
made from the array the worker sent, through its own methods.
"""

from __future__ import annotations

import base64
import binascii
import sys
from array import array
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

# Little-endian IEEE 754 binary32: the stored layout and the base64 answers' layout.
DTYPE = "<f4"
ITEMSIZE = 4


class EncodingFormat(StrEnum):
    """How an answer carries a vector (OpenAI's ``encoding_format``)."""

    FLOAT = "float"  # a JSON list of numbers
    BASE64 = "base64"  # base64 of the little-endian float32 bytes


def is_vector_batch(outputs: Any) -> bool:
    """Whether a worker's outputs are one numeric array, a row per input (stored as
    vectors) rather than a list of JSON values."""
    shape = getattr(outputs, "shape", None)
    kind = getattr(getattr(outputs, "dtype", None), "kind", None)
    return shape is not None and len(shape) == 2 and kind in ("f", "i", "u")


def rows_as_bytes(outputs: Any) -> list[bytes]:
    """Each row of a 2-D numeric array as little-endian float32 bytes, converted in one
    pass over the whole batch (no Python object per value)."""
    n, dim = outputs.shape
    flat = outputs.astype(DTYPE, copy=False).tobytes(order="C")
    step = dim * ITEMSIZE
    return [flat[i * step : (i + 1) * step] for i in range(n)]


def to_base64(vector: bytes) -> str:
    return base64.b64encode(vector).decode("ascii")


def from_base64(text: str) -> bytes:
    """The bytes of a base64 vector; ValueError if it is not one."""
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"not base64: {exc}") from exc
    if len(raw) % ITEMSIZE:
        raise ValueError(f"{len(raw)} bytes is not a whole number of float32 values")
    return raw


def as_array(vector: bytes) -> array[float]:
    """The values of a stored vector as a float32 array."""
    values = array("f")
    values.frombytes(vector)
    if sys.byteorder == "big":
        values.byteswap()
    return values


def to_floats(vector: bytes) -> list[float]:
    """The values of a stored vector, as Python floats (each exactly its float32)."""
    return as_array(vector).tolist()


def from_floats(values: Iterable[float]) -> bytes:
    """Little-endian float32 bytes of ``values`` (a shortened vector's answer; tests)."""
    out = array("f", values)
    if sys.byteorder == "big":
        out.byteswap()
    return out.tobytes()


def stored_vector(row: Mapping[str, Any]) -> array[float]:
    """The float32 vector of a finished request's row: stored as little-endian float32
    bytes (``output_vector``) where the result store keeps them so, else as the JSON
    list of numbers the worker's float32 row was written as (exact in float64)."""
    raw = row.get("output_vector")
    if isinstance(raw, bytes | bytearray | memoryview):
        return as_array(bytes(raw))
    out = row.get("output")
    if isinstance(out, list) and all(isinstance(x, int | float) for x in out):
        return array("f", out)
    raise ValueError(f"the model's answer is not a vector (got {type(out).__name__})")


def answer_output(output: Any, vector: bytes | None, encoding: EncodingFormat) -> Any:
    """What an answer's ``output`` holds: the JSON output as stored, or the vector as a
    list of floats or as base64."""
    if vector is None:
        return output
    if encoding is EncodingFormat.BASE64:
        return to_base64(vector)
    return to_floats(vector)
