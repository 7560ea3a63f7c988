"""Which write failures are retried and which are the rows' fault (results/faults.py),
over the exception types psycopg and SQLAlchemy really raise; and a stored copy of
any value PostgreSQL can hold."""

from __future__ import annotations

import math

import orjson
import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg import errors as pg
from psycopg.adapt import PyFormat, Transformer
from sqlalchemy import exc as sa_exc

from results.faults import NUL_ESCAPE, Fault, classify, first_line, storable


def _driver_error(value: object) -> psycopg.Error:
    """What psycopg itself raises when asked to send ``value`` (no server involved)."""
    tx = Transformer()
    try:
        tx.get_dumper(value, PyFormat.AUTO).dump(value)
    except psycopg.Error as exc:
        return exc
    raise AssertionError(f"psycopg sent {value!r}")


def _wrapped(orig: BaseException) -> sa_exc.DBAPIError:
    """As SQLAlchemy re-raises a driver error from ``conn.execute``."""
    exc = sa_exc.DBAPIError.instance("INSERT INTO requests ...", {}, orig, psycopg.Error)
    assert isinstance(exc, sa_exc.DBAPIError)
    return exc


TRANSIENT = [
    psycopg.OperationalError("consuming input failed: server closed the connection"),
    psycopg.InterfaceError("the connection is closed"),
    pg.SerializationFailure("could not serialize access"),
    pg.DeadlockDetected("deadlock detected"),
    pg.LockNotAvailable("canceling statement due to lock timeout"),
    pg.QueryCanceled("canceling statement due to statement timeout"),
    pg.AdminShutdown("terminating connection due to administrator command"),
    pg.CrashShutdown("terminating connection because of crash of another server process"),
    pg.CannotConnectNow("the database system is starting up"),
    pg.TooManyConnections("sorry, too many clients already"),
    pg.DiskFull("could not extend file"),
    pg.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"),
    pg.ConnectionFailure("connection failure"),
    pg.IoError("could not read block"),
]
DATA = [
    pg.UntranslatableCharacter("unsupported Unicode escape sequence"),  # \u0000 in jsonb
    pg.CharacterNotInRepertoire("invalid byte sequence for encoding UTF8"),
    pg.InvalidTextRepresentation('invalid input syntax for type uuid: "x"'),
    pg.NumericValueOutOfRange("integer out of range"),
    pg.StringDataRightTruncation("value too long"),
    pg.NotNullViolation('null value in column "tenant_id"'),
    pg.CheckViolation('violates check constraint "requests_status_check"'),
    pg.UniqueViolation("duplicate key value violates unique constraint"),
    pg.ForeignKeyViolation("violates foreign key constraint"),
    pg.ProgramLimitExceeded("total size of jsonb array elements exceeds the maximum"),
]
UNEXPECTED = [
    pg.UndefinedTable('relation "requests" does not exist'),
    pg.UndefinedColumn('column "persisted_at" does not exist'),
    pg.InvalidPassword("password authentication failed"),
    pg.InternalError_("internal error"),
    psycopg.ProgrammingError("the query has 25 placeholders but 24 parameters were passed"),
    ValueError("3 outputs for 4 requests"),
]


@pytest.mark.parametrize("exc", TRANSIENT, ids=lambda e: type(e).__name__)
def test_transient_faults_are_retried(exc: psycopg.Error) -> None:
    assert classify(exc) is Fault.TRANSIENT
    assert classify(_wrapped(exc)) is Fault.TRANSIENT


@pytest.mark.parametrize("exc", DATA, ids=lambda e: type(e).__name__)
def test_the_rows_values_are_isolated(exc: psycopg.Error) -> None:
    assert classify(exc) is Fault.DATA
    assert classify(_wrapped(exc)) is Fault.DATA


@pytest.mark.parametrize("exc", UNEXPECTED, ids=lambda e: type(e).__name__)
def test_other_faults_are_never_blamed_on_the_rows(exc: Exception) -> None:
    assert classify(exc) is Fault.UNEXPECTED
    if isinstance(exc, psycopg.Error):
        assert classify(_wrapped(exc)) is Fault.UNEXPECTED


def test_sqlalchemy_picks_the_wrapper_psycopg_errors_map_to() -> None:
    assert isinstance(_wrapped(DATA[0]), sa_exc.DataError)
    assert isinstance(_wrapped(DATA[5]), sa_exc.IntegrityError)
    assert isinstance(_wrapped(TRANSIENT[2]), sa_exc.OperationalError)
    assert isinstance(_wrapped(UNEXPECTED[0]), sa_exc.ProgrammingError)


def test_driver_refusals_of_values_are_the_rows_fault() -> None:
    nul = _driver_error("input with a \x00 in it")
    assert isinstance(nul, psycopg.DataError) and "NUL" in str(nul) and nul.sqlstate is None
    assert classify(nul) is Fault.DATA
    cannot = _driver_error(object())
    assert isinstance(cannot, psycopg.ProgrammingError) and "cannot adapt" in str(cannot)
    assert classify(cannot) is Fault.DATA


def test_values_json_cannot_carry_are_the_rows_fault() -> None:
    for value in ("\ud800", 2**70):
        with pytest.raises(orjson.JSONEncodeError) as info:
            orjson.dumps(value)
        assert classify(info.value) is Fault.DATA


def test_a_lost_pooled_connection_is_transient() -> None:
    lost = _wrapped(psycopg.OperationalError("server closed the connection"))
    lost.connection_invalidated = True
    assert classify(lost) is Fault.TRANSIENT
    assert classify(sa_exc.TimeoutError("QueuePool limit reached")) is Fault.TRANSIENT
    assert classify(ConnectionResetError()) is Fault.TRANSIENT


def test_first_line_drops_the_statement_sqlalchemy_appends() -> None:
    exc = _wrapped(DATA[0])
    assert "\n" in str(exc) and first_line(exc).endswith("unsupported Unicode escape sequence")
    assert first_line(None) == ""


def test_storable_makes_nul_and_surrogates_readable_at_any_depth() -> None:
    value = {"a\x00b": ["x\x00", {"k": "\ud800 lone"}], "n": 2**70, "f": math.inf, "ok": 1.5}
    out = storable(value)
    assert out == {
        f"a{NUL_ESCAPE}b": [f"x{NUL_ESCAPE}", {"k": "\\ud800 lone"}],
        "n": str(2**70),
        "f": "inf",
        "ok": 1.5,
    }
    assert storable("plain") == "plain" and storable(None) is None and storable(True) is True


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(), kids, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_any_stored_copy_is_json_without_nul(value: object) -> None:
    text = orjson.dumps(storable(value)).decode()
    assert "\x00" not in text and "\\u0000" not in text.replace("\\\\u0000", "")
