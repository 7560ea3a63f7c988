"""What a client's value must be for Kafka and PostgreSQL to carry it.

Every stage that accepts client data runs these checks before it produces or
stores anything, so a value that would fail later (in the persister, after the
client was told "accepted") is refused at the door with a 400 naming the field.
What fails later, measured against PostgreSQL 15, psycopg 3 and orjson 3
(docs/decisions/0025-edge-validation-caps-and-error-mapping.md):

* U+0000 in any string: ``text`` refuses NUL bytes and ``jsonb`` refuses ``\\u0000``
  (SQLSTATE 22P05), in keys as in values.
* lone UTF-16 surrogates (U+D800..U+DFFF): psycopg cannot encode them to UTF-8 and
  ``jsonb`` refuses the escape (22P02). orjson already refuses them when parsing a
  body; other parsers (the stdlib ``json``, form fields, headers) do not.
* NaN and +-Infinity: ``jsonb`` refuses them (22P02) and orjson writes them as null.
* integers outside [-2**63, 2**64 - 1]: orjson cannot write them ("Integer exceeds
  64-bit range"), so the Kafka message cannot be encoded. Integers bound for an
  ``int4``/``int8`` column (cursors, indexes) need ``check_int`` with that range.
* nesting deeper than about 250 levels: orjson refuses to write it, and psycopg's
  own JSON dumper hits Python's recursion limit near 1,000.
* ids that are not canonical UUIDs: PostgreSQL parses ``{...}`` and bare hex but
  refuses ``urn:uuid:...`` (22P02); ids are matched strictly here instead.

Pure code: no I/O, raises ``InvalidInput`` (400) naming the field.
"""

from __future__ import annotations

import math
import re
from typing import Any

import orjson

from core.errors import InvalidInput

INT32_MAX = 2**31 - 1
INT64_MIN = -(2**63)
UINT64_MAX = 2**64 - 1  # the largest integer orjson writes

_SURROGATE = re.compile("[\ud800-\udfff]")
_CANONICAL_UUID = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
# Visible ASCII and space: what an HTTP header token such as Idempotency-Key may hold.
_HEADER_TOKEN = re.compile(r"[\x20-\x7e]+")
# A decimal a client sends in a header or a form field: ASCII digits only. ``str.isdigit``
# and ``int`` also take other scripts' digits ("²" passes the one and fails the other).
_ASCII_DECIMAL = re.compile(r"[0-9]+")

# How much of a client's string an error message echoes back.
SHOWN_CHARS = 64


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """A client's value as an error message may quote it: escaped and short."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_text(value: str, field: str, *, max_chars: int | None = None) -> str:
    """``value`` as a column or a JSON string can hold it; returns it unchanged."""
    if max_chars is not None and len(value) > max_chars:
        raise InvalidInput(
            f"{field} is {len(value)} characters; at most {max_chars} allowed", field=field
        )
    if "\x00" in value:
        raise InvalidInput(
            f"{field} contains the character U+0000 (NUL), which cannot be stored", field=field
        )
    # An ASCII string (flagged by CPython, no scan) holds no surrogate: most text skips
    # the search, a sixth of a job item's staging on a GPU host (docs/bench/gpu-host.md).
    bad = None if value.isascii() else _SURROGATE.search(value)
    if bad is not None:
        raise InvalidInput(
            f"{field} contains a lone UTF-16 surrogate (U+{ord(bad.group()):04X}), "
            "which is not valid Unicode",
            field=field,
        )
    return value


def check_int(value: int, field: str, *, lo: int, hi: int) -> int:
    if not lo <= value <= hi:
        raise InvalidInput(f"{field} must be between {lo} and {hi}", field=field)
    return value


def check_number(value: int | float, field: str) -> None:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInput(
                f"{field} is {value!r}; only finite numbers can be stored", field=field
            )
    elif not INT64_MIN <= value <= UINT64_MAX:
        raise InvalidInput(
            f"{field} is an integer outside the 64-bit range [{INT64_MIN}, {UINT64_MAX}]",
            field=field,
        )


def check_json(value: Any, field: str, *, max_depth: int) -> None:
    """Every string (keys too), number and container inside ``value``, without
    recursion (a hostile document is as deep as the parser allows)."""
    stack: list[tuple[Any, str, int]] = [(value, field, 0)]
    while stack:
        v, where, depth = stack.pop()
        if isinstance(v, str):
            check_text(v, where)
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, int | float):
            check_number(v, where)
        elif isinstance(v, dict | list):
            if depth >= max_depth:
                raise InvalidInput(f"{where} nests deeper than {max_depth} levels", field=where)
            if isinstance(v, dict):
                for k, item in v.items():
                    if not isinstance(k, str):
                        raise InvalidInput(f"{where} has a key that is not a string", field=where)
                    try:
                        check_text(k, where)
                    except InvalidInput as exc:
                        raise InvalidInput(
                            f"{where} has a key {shown(k)} that cannot be stored: "
                            + exc.message.removeprefix(f"{where} "),
                            field=where,
                        ) from None
                    stack.append((item, f"{where}.{_path_part(k)}", depth + 1))
            else:
                stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(v))
        else:
            raise InvalidInput(f"{where} holds a {type(v).__name__}, not a JSON value", field=where)


def _path_part(key: str) -> str:
    """A key as it appears in a field path: itself when short and printable."""
    return key if len(key) <= SHOWN_CHARS and key.isprintable() and key else shown(key)


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact JSON (what Kafka and ``jsonb`` carry)."""
    return len(orjson.dumps(value))


def check_object(value: Any, field: str, *, max_bytes: int, max_depth: int) -> int:
    """A free-form JSON value (params, metadata): storable and at most ``max_bytes``
    as JSON. Returns its size in bytes."""
    check_json(value, field, max_depth=max_depth)
    size = json_size(value)
    if size > max_bytes:
        raise InvalidInput(
            f"{field} is {size} bytes as JSON; at most {max_bytes} allowed",
            field=field,
        )
    return size


def ascii_decimal(value: str, *, max_digits: int = 18) -> int | None:
    """``value`` as a non-negative integer when it is 1..``max_digits`` ASCII digits,
    else None (a caller answers 400 naming its field). 18 digits fit a bigint."""
    if not 0 < len(value) <= max_digits or _ASCII_DECIMAL.fullmatch(value) is None:
        return None
    return int(value)


def check_header_token(value: str, field: str, *, max_chars: int) -> str:
    """A client-chosen header value (Idempotency-Key): 1..max_chars visible ASCII."""
    if not 0 < len(value) <= max_chars or _HEADER_TOKEN.fullmatch(value) is None:
        raise InvalidInput(
            f"{field} must be 1 to {max_chars} visible ASCII characters", field=field
        )
    return value


def canonical_uuid(value: str) -> str | None:
    """``value`` as the canonical lower-case UUID, or None unless it is exactly the
    8-4-4-4-12 hex form (no braces, no ``urn:uuid:``, no bare hex)."""
    if len(value) != 36 or _CANONICAL_UUID.fullmatch(value) is None:
        return None
    return value.lower()
