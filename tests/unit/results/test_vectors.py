"""Vector outputs: stored as little-endian float32, answered as floats or base64."""

from __future__ import annotations

import base64
import struct

import numpy as np
import pytest

from results.vectors import (
    EncodingFormat,
    answer_output,
    from_base64,
    from_floats,
    is_vector_batch,
    rows_as_bytes,
    to_base64,
    to_floats,
)


def test_rows_become_little_endian_float32_bytes_one_per_row() -> None:
    out = np.arange(12, dtype=np.float32).reshape(3, 4) / 3
    rows = rows_as_bytes(out)
    assert len(rows) == 3 and all(len(r) == 16 for r in rows)
    assert list(struct.unpack("<4f", rows[1])) == out[1].tolist()


def test_a_big_endian_or_wider_array_is_stored_the_same_way() -> None:
    values = np.array([[1.5, -2.25, 3.0]], dtype=">f8")
    assert rows_as_bytes(values) == [struct.pack("<3f", 1.5, -2.25, 3.0)]
    half = np.array([[0.1, 65504.0]], dtype=np.float16)
    assert to_floats(rows_as_bytes(half)[0]) == [float(v) for v in half[0]]  # float16 exact


def test_a_float64_value_is_rounded_to_float32() -> None:
    [b] = rows_as_bytes(np.array([[0.1]], dtype=np.float64))
    assert to_floats(b) == [float(np.float32(0.1))] and to_floats(b) != [0.1]


def test_base64_answer_is_openais_layout() -> None:
    """OpenAI's encoding_format=base64: base64 of the little-endian float32 bytes,
    which numpy.frombuffer(..., dtype='<f4') reads back."""
    vec = from_floats([0.25, -1.0, 3.5])
    text = answer_output(None, vec, EncodingFormat.BASE64)
    assert text == base64.b64encode(struct.pack("<3f", 0.25, -1.0, 3.5)).decode()
    assert np.frombuffer(base64.b64decode(text), dtype="<f4").tolist() == [0.25, -1.0, 3.5]
    assert answer_output(None, vec, EncodingFormat.FLOAT) == [0.25, -1.0, 3.5]


def test_a_json_output_is_answered_as_stored() -> None:
    assert answer_output({"digest": "ab"}, None, EncodingFormat.BASE64) == {"digest": "ab"}


def test_special_values_survive() -> None:
    vals = [float("inf"), float("-inf"), 0.0, -0.0, 1e-45, 3.4028234663852886e38]
    back = to_floats(from_base64(to_base64(from_floats(vals))))
    assert back[:2] == vals[:2] and back[4] == pytest.approx(1.401298464324817e-45)
    assert str(back[3]) == "-0.0" and back[5] == vals[5]
    nan = to_floats(from_floats([float("nan")]))[0]
    assert nan != nan


def test_bad_base64_is_refused() -> None:
    with pytest.raises(ValueError):
        from_base64("not base64!")
    with pytest.raises(ValueError):
        from_base64(base64.b64encode(b"abc").decode())  # 3 bytes: not float32s


def test_only_a_two_dimensional_numeric_array_is_a_vector_batch() -> None:
    assert is_vector_batch(np.zeros((2, 3), dtype=np.float32))
    assert is_vector_batch(np.zeros((2, 3), dtype=np.int64))
    assert not is_vector_batch(np.zeros(3, dtype=np.float32))
    assert not is_vector_batch([[0.1, 0.2]])
    assert not is_vector_batch(np.array([["a"]]))
    assert not is_vector_batch([{"digest": "x"}])
