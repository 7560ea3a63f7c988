"""Why a write failed, and a copy of a value PostgreSQL can hold. Pure.

A failed write is one of three things (docs/decisions/0019-bad-rows-and-bad-messages.md):

* ``TRANSIENT``: the database or the path to it is briefly unable (connection lost,
  server restarting, serialization failure, deadlock, lock or statement timeout, out
  of disk or connections, a standby during failover). Retried with backoff.
* ``DATA``: the rows themselves cannot be stored (a NUL in text or JSON, a value out
  of a column's range, a constraint the row breaks, a value the driver cannot encode).
  Retrying cannot help; the writer isolates the offending rows by splitting the batch.
* ``UNEXPECTED``: anything else (a missing table, a refused password, a bug of ours).
  Not the rows' fault, so never blamed on them: retried with backoff and logged loudly,
  since recording good requests as failed would lose their results.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any

import orjson
import psycopg
from sqlalchemy import exc as sa_exc


class Fault(StrEnum):
    TRANSIENT = "transient"
    DATA = "data"
    UNEXPECTED = "unexpected"


# SQLSTATE classes (the first two characters) that pass with time.
_TRANSIENT_CLASSES = frozenset(
    {
        "08",  # connection exception
        "40",  # transaction rollback: serialization failure, deadlock (40002 below)
        "53",  # insufficient resources: disk full, out of memory, too many connections
        "57",  # operator intervention: query canceled (statement timeout), shutdown
        "58",  # system error: I/O error
    }
)
_TRANSIENT_STATES = frozenset(
    {
        "55P03",  # lock_not_available (lock_timeout)
        "55006",  # object_in_use
        "25006",  # read_only_sql_transaction: a standby, mid-failover
        "25P03",  # idle_in_transaction_session_timeout
    }
)
# Classes and states the row's values cause.
_DATA_CLASSES = frozenset(
    {
        "22",  # data exception: NUL or untranslatable character, out of range, bad text
        "23",  # integrity constraint violation (the request upsert never raises one)
    }
)
_DATA_STATES = frozenset(
    {
        "40002",  # transaction_integrity_constraint_violation (a deferred constraint)
        "54000",  # program_limit_exceeded: a value too large (jsonb, index row size)
    }
)


def classify(exc: BaseException) -> Fault:
    """What ``exc``, raised while writing rows, says about retrying them."""
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return Fault.TRANSIENT
    if isinstance(exc, sa_exc.TimeoutError | sa_exc.DisconnectionError):
        return Fault.TRANSIENT  # no pooled connection in time, or a dead one
    orig: BaseException = exc
    if isinstance(exc, sa_exc.StatementError) and exc.orig is not None:
        orig = exc.orig
    if isinstance(orig, orjson.JSONEncodeError | UnicodeError):
        return Fault.DATA  # a value JSON or UTF-8 cannot carry (a lone surrogate)
    if isinstance(orig, psycopg.Error):
        state = orig.sqlstate
        if state is None:  # raised by the driver itself, before the server saw it
            if isinstance(orig, psycopg.DataError):
                return Fault.DATA  # e.g. "PostgreSQL text fields cannot contain NUL"
            if isinstance(orig, psycopg.ProgrammingError) and "cannot adapt" in str(orig):
                return Fault.DATA  # a value of a type it cannot send
            if isinstance(orig, psycopg.OperationalError | psycopg.InterfaceError):
                return Fault.TRANSIENT  # could not connect, or the connection closed
            return Fault.UNEXPECTED
        if state in _DATA_STATES or state[:2] in _DATA_CLASSES:
            return Fault.DATA
        if state in _TRANSIENT_STATES or state[:2] in _TRANSIENT_CLASSES:
            return Fault.TRANSIENT
        return Fault.UNEXPECTED
    if isinstance(orig, ConnectionError | TimeoutError):
        return Fault.TRANSIENT
    return Fault.UNEXPECTED


def first_line(exc: BaseException | None, limit: int = 300) -> str:
    """The first line of an error: SQLAlchemy's full text repeats the whole statement."""
    lines = str(exc).splitlines() if exc else []
    return lines[0][:limit] if lines else type(exc).__name__ if exc else ""


# The escape a NUL becomes in a stored copy: what JSON would write for it, readable.
NUL_ESCAPE = "\\u0000"
_INT8 = 2**63


def storable(value: Any) -> Any:
    """``value`` with what PostgreSQL's text and JSONB cannot hold made readable: a NUL
    becomes the six characters ``\\u0000``, a lone surrogate its ``\\udXXX`` escape, an
    integer beyond 64 bits or a non-finite float its text; in strings, keys and values
    of any depth. Everything else is returned as it is."""
    if isinstance(value, str):
        if "\x00" in value:
            value = value.replace("\x00", NUL_ESCAPE)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            value = value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if -_INT8 <= value < _INT8 else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(storable(k)): storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable(v) for v in value]
    if hasattr(value, "tolist"):  # a numpy row
        return storable(value.tolist())
    return storable(str(value))
