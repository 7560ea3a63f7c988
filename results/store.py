"""Writing results: one transaction per batch, then one announcement.

Rows are upserted with ON CONFLICT DO NOTHING on the request log's key (request_id,
received_at): every message of one request carries the same received_at, so a request
redelivered by Kafka (after a crash between persist and offset commit) meets its first
row, never yields a second, and the first answer stands. The NOTIFY is sent just after
the rows' commit, in a transaction of its own that waits for no WAL flush, so an answer
is heard only once its row is durable and visible, and announcing writers do not commit
one flush at a time; it carries the sync answers themselves (results/announce.py). See
docs/decisions/0003-results-announced-by-notify.md and 0070.

The write is shaped by what it costs per row (docs/decisions/0029-compact-results-and-a-
partitioned-request-log.md, docs/bench/store.md): vector outputs go in as float32 bytes
(results/vectors.py), every column as one array in PostgreSQL's binary format (text
arrays of timestamps and bytes cost the driver 30 to 40 us a row to format and the
server as much to parse), through one cached statement whatever the batch size; all
the batch's announcements leave in one statement; job counters are advanced last, so
the job's row lock is held only while the transaction commits.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import orjson
import psycopg
from sqlalchemy import BigInteger, Connection, DateTime, Engine, Integer, Text
from sqlalchemy.dialects.postgresql import BYTEA, JSONB, UUID

from results import announce
from results.db import RESULTS_CHANNEL, libpq_url
from results.faults import first_line
from results.jobs import record_job_results, settle, writer_id
from results.schema import REQUEST_ROW_COLUMNS, RequestRow, batches, requests

log = logging.getLogger(__name__)

_PG_TYPES: dict[type, str] = {
    UUID: "uuid",
    Text: "text",
    JSONB: "jsonb",
    BYTEA: "bytea",
    Integer: "int4",
    BigInteger: "int8",
    DateTime: "timestamptz",
}
# (column, PostgreSQL type) in RequestRow's order, from the table's own column types.
_REQUEST_COLUMNS: tuple[tuple[str, str], ...] = tuple(
    (name, _PG_TYPES[type(requests.c[name].type)]) for name in REQUEST_ROW_COLUMNS
)


def _array_param(pgtype: str) -> str:
    """One column's array parameter. Uuids and JSON travel as text (each element is
    parsed once by the server); the rest in their own binary format. The driver picks
    the smallest integer type that holds a list's values, so integers are cast."""
    if pgtype == "jsonb":
        return "%b::text[]::jsonb[]"
    if pgtype == "uuid":
        return "%b::text[]::uuid[]"
    return f"%b::{pgtype}[]"


def _scalar_param(pgtype: str) -> str:
    """A column whose value every row of the write shares, sent once."""
    if pgtype in ("jsonb", "uuid"):
        return f"%b::text::{pgtype}"
    return f"%b::{pgtype}"


# A column whose value every row of a write shares (a batch's model, status and times,
# its tenant or job, an output column the model does not use) is sent once, so neither
# the driver nor the server handles it per row. request_id, unique to each row, is
# always an array (unnest needs one); there is a statement per set of shared columns,
# and few sets occur.
_NEVER_SHARED = "request_id"


@lru_cache(maxsize=256)
def insert_statement(shared: tuple[bool, ...]) -> str:
    """The INSERT of request rows whose columns flagged in ``shared`` hold one value for
    every row (parameters: those values in column order, then one array per other
    column). It returns the ids written - a redelivered request meets its first row and
    is skipped (ON CONFLICT without a target works on the partitioned log and on the
    single table before it, docs/decisions/0029) - and the transaction's time, which
    is every new row's ``persisted_at``."""
    cols = [(c, t, one) for (c, t), one in zip(_REQUEST_COLUMNS, shared, strict=True)]
    select = ", ".join(_scalar_param(t) if one else f'u."{c}"' for c, t, one in cols)
    arrays = ", ".join(_array_param(t) for _, t, one in cols if not one)
    names = ", ".join(f'"{c}"' for c, _, one in cols if not one)
    return (
        f"WITH written AS (INSERT INTO requests ({', '.join(c for c, _, _ in cols)}) "
        f"SELECT {select} FROM unnest({arrays}) AS u({names}) "
        "ON CONFLICT DO NOTHING RETURNING request_id) "
        "SELECT coalesce(array_agg(request_id::text), '{}'), now() FROM written"
    )


_NOTIFY = "SELECT pg_notify(c, p) FROM unnest(%b::text[], %b::text[]) AS u(c, p)"
_ASYNC_COMMIT = "SET LOCAL synchronous_commit TO off"
_OUTPUT = [c for c, _ in _REQUEST_COLUMNS].index("output")
_VECTOR = [c for c, _ in _REQUEST_COLUMNS].index("output_vector")


def _json(value: Any) -> str:
    """JSON text of a column value. A numpy row (a model's array output not stored as a
    vector) is written as float64, which orjson prints exactly as it prints the same
    values as Python floats."""
    if hasattr(value, "dtype") and hasattr(value, "astype"):
        return orjson.dumps(value.astype("float64"), option=orjson.OPT_SERIALIZE_NUMPY).decode()
    return orjson.dumps(value).decode()


def column_arrays(rows: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """The rows as one list per column, in ``_REQUEST_COLUMNS``' order."""
    out = []
    for name, pgtype in _REQUEST_COLUMNS:
        if pgtype == "jsonb":
            out.append([None if r[name] is None else _json(r[name]) for r in rows])
        else:
            out.append([r[name] for r in rows])
    return out


def insert_parameters(arrays: list[list[Any]]) -> tuple[str, list[Any]]:
    """The statement and parameters that insert ``arrays`` (``column_arrays``' output):
    a column of one repeated value goes as that value. Pure."""
    n = len(arrays[0])
    shared = tuple(
        n > 1 and name != _NEVER_SHARED and col.count(col[0]) == n
        for (name, _), col in zip(_REQUEST_COLUMNS, arrays, strict=True)
    )
    scalars = [col[0] for col, one in zip(arrays, shared, strict=True) if one]
    rest = [col for col, one in zip(arrays, shared, strict=True) if not one]
    return insert_statement(shared), scalars + rest


def write_results(
    conn: Connection, request_rows: list[RequestRow], *batch_rows: dict[str, Any] | None
) -> list[str]:
    """``write_on`` inside the caller's SQLAlchemy transaction (it commits, then calls
    ``settle_jobs``)."""
    driver = conn.connection.driver_connection  # the psycopg connection, same transaction
    assert driver is not None
    return write_on(driver, request_rows, [b for b in batch_rows if b is not None], commit=False)


def write_on(
    pg: psycopg.Connection[Any],
    request_rows: list[RequestRow],
    batch_rows: Sequence[dict[str, Any]],
    *,
    commit: bool,
    inline_max: int = announce.INLINE_MAX,
) -> list[str]:
    """Upsert rows and announce them on ``pg`` (committing if ``commit``); returns the
    ids that were newly written. ``batch_rows``: the rows of the batches they ran in
    (the persister may write several batches' results in one transaction).

    Two round trips to the server whatever the write holds, both pipelined: the batch
    rows and the request rows (with the transaction's BEGIN), whose answer says which
    rows are new; then the job counters and the COMMIT, and the announcements in a
    transaction of their own after it (in the caller's, without ``commit``). Each round
    trip costs a scheduler thread a wait for the server and for the interpreter lock
    after it, so a write of six or eight sequential statements held a persist thread
    longer than its rows' work did (docs/bench/store.md). ``inline_max``: the largest
    answer announced with its payload (``announcements``)."""
    inserted = pg.cursor()
    arrays = column_arrays(request_rows) if request_rows else []
    with pg.pipeline():
        for brow in batch_rows:
            pg.cursor().execute(_batch_insert(tuple(brow)), brow)
        if request_rows:
            inserted.execute(*insert_parameters(arrays))
    written: list[str] = []
    notes: list[tuple[str, str]] = []
    jobs: list[tuple[str, str | None, int | None, str]] = []
    if request_rows:
        got = inserted.fetchone()
        assert got is not None
        written, persisted_at = got
        new = is_written(request_rows, written)
        notes = announcements(
            request_rows, arrays[_OUTPUT], arrays[_VECTOR], new, persisted_at, inline_max
        )
        jobs = [
            (r["request_id"], r["job_id"], r["item_index"], r["status"])
            for r, fresh in zip(request_rows, new, strict=True)
            if fresh and r["job_id"] is not None
        ]
    cur = pg.cursor()
    channels, payloads = [c for c, _ in notes], [p for _, p in notes]
    with pg.pipeline():
        if notes and not commit:  # the caller's transaction: announced when it commits
            cur.execute(_NOTIFY, (channels, payloads))
        record_job_results(cur, jobs, writer_id())
        if commit:
            pg.commit()
            if notes:
                # Announced once the rows are durable, in a transaction of its own that
                # waits for no flush: PostgreSQL lets one announcing transaction commit
                # at a time, so a NOTIFY in the rows' own transaction would hold every
                # other writer's announcement through this one's WAL flush (decision 70).
                cur.execute(_ASYNC_COMMIT)
                cur.execute(_NOTIFY, (channels, payloads))
                pg.commit()
            # Every job of the write, new rows or not: a redelivered write settles what
            # a crash after the commit left unsettled.
            settle(cur, job_ids(request_rows))
            pg.commit()
    return list(written)


def job_ids(rows: Sequence[Mapping[str, Any]]) -> set[str]:
    return {r["job_id"] for r in rows if r["job_id"] is not None}


def settle_jobs(engine: Engine, rows: Sequence[Mapping[str, Any]]) -> None:
    """After a ``write_results`` transaction committed: settle its rows' jobs."""
    ids = job_ids(rows)
    if ids:
        with engine.begin() as conn:
            driver = conn.connection.driver_connection
            assert driver is not None
            settle(driver.cursor(), ids)


@lru_cache(maxsize=8)
def _batch_insert(columns: tuple[str, ...]) -> str:
    """The batch row's INSERT (its columns are scheduler/runtime/rows.py's, checked here)."""
    unknown = set(columns) - set(batches.c.keys())
    if unknown:
        raise ValueError(f"not columns of batches: {sorted(unknown)}")
    values = ", ".join(f"%({c})s" for c in columns)
    return f"INSERT INTO batches ({', '.join(columns)}) VALUES ({values}) ON CONFLICT DO NOTHING"


class ResultWriter:
    """The scheduler's result writes, each a transaction of its own on a connection its
    persist thread keeps: no pool checkout and no liveness ping before every write (a
    round trip each). A write that fails rolls back; a connection that broke is
    dropped, and the thread's next write (the persister retries transient faults)
    connects again."""

    def __init__(
        self,
        database_url: str,
        *,
        connect_timeout_s: int = 10,
        inline_max: int = announce.INLINE_MAX,
    ):
        self._url = libpq_url(database_url)
        self._inline_max = inline_max
        self._timeout = connect_timeout_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[psycopg.Connection[Any]] = set()
        self._spare: list[psycopg.Connection[Any]] = []  # opened ahead, not yet a thread's

    def connect_ahead(self, n: int) -> int:
        """Open up to ``n`` connections now, for the persist threads' first writes to
        take: on a fresh system every thread of every scheduler otherwise connected at its
        first write, all in the same second, and the first results waited for that
        (r17, r18 on the GPU host: in two fresh starts of six, the first commits took
        630-680 ms). Best effort: a database not reachable yet is connected to at the
        first write, as before. Returns how many opened."""
        opened = 0
        for _ in range(n):
            try:
                pg = psycopg.connect(self._url, autocommit=False, connect_timeout=self._timeout)
            except psycopg.Error as exc:
                log.info("result writer: connecting ahead stopped: %s", first_line(exc))
                break
            with self._lock:
                self._open.add(pg)
                self._spare.append(pg)
            opened += 1
        return opened

    def __call__(
        self, request_rows: list[RequestRow], batch_rows: Sequence[dict[str, Any]]
    ) -> list[str]:
        pg = self._connection()
        try:
            return write_on(pg, request_rows, batch_rows, commit=True, inline_max=self._inline_max)
        except BaseException:
            self._recover(pg)
            raise

    def _connection(self) -> psycopg.Connection[Any]:
        pg: psycopg.Connection[Any] | None = getattr(self._local, "pg", None)
        if pg is None or pg.closed:
            with self._lock:
                pg = self._spare.pop() if self._spare else None
            if pg is None or pg.closed:
                pg = psycopg.connect(self._url, autocommit=False, connect_timeout=self._timeout)
            self._local.pg = pg
            with self._lock:
                self._open.add(pg)
        return pg

    def _recover(self, pg: psycopg.Connection[Any]) -> None:
        if not pg.broken:
            with contextlib.suppress(psycopg.Error):
                pg.rollback()
                return
        self._forget(pg)

    def _forget(self, pg: psycopg.Connection[Any]) -> None:
        with contextlib.suppress(psycopg.Error):
            pg.close()
        with self._lock:
            self._open.discard(pg)
        self._local.pg = None

    def close(self) -> None:
        """Close every thread's connection (the persister has stopped)."""
        with self._lock:
            conns, self._open, self._spare = list(self._open), set(), []
        for pg in conns:
            with contextlib.suppress(psycopg.Error):
                pg.close()


def is_written(rows: Sequence[Mapping[str, Any]], written: Sequence[str]) -> list[bool]:
    """Whether each row is among the ids the insert returned (PostgreSQL's spelling of
    a UUID; a row's id in another spelling of the same UUID still matches). Pure."""
    ids = set(written)
    out = []
    for r in rows:
        rid = r["request_id"]
        if rid not in ids and ids:
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                rid = str(uuid.UUID(str(rid)))
        out.append(rid in ids)
    return out


def announcements(
    request_rows: Sequence[Mapping[str, Any]],
    outputs: Sequence[str | None],
    vectors: Sequence[bytes | None],
    written: Sequence[bool],
    persisted_at: datetime,
    inline_max: int = announce.INLINE_MAX,
) -> list[tuple[str, str]]:
    """(channel, payload) of every announcement. Every sync request is announced,
    written now or before: a waiter may be waiting on a redelivered request whose first
    row landed while it was not listening. Those written now carry their answer; the
    others (and answers larger than ``inline_max`` bytes) are announced by id and
    fetched. Each goes on its row's reply channel, the one API process that waits for
    it (decision 70), else on the shared channel. Job items have no waiter (job results are read by
    polling the job's rows): announcing thousands a second would only keep every API
    instance busy. Pure."""
    answers = announce.Answers(persisted_at)
    inline: dict[str, list[bytes]] = {}
    by_id: dict[str, list[str]] = {}
    for row, output, vector, new in zip(request_rows, outputs, vectors, written, strict=True):
        if row["job_id"] is not None:
            continue
        channel = row.get("reply_to", RESULTS_CHANNEL)
        answer = answers.answer(row, output, vector) if new and inline_max > 0 else None
        if answer is not None and len(answer) <= min(inline_max, announce.INLINE_MAX):
            inline.setdefault(channel, []).append(answer)
        else:
            by_id.setdefault(channel, []).append(str(row["request_id"]))
    return [
        (channel, payload)
        for channel in {**inline, **by_id}
        for payload in announce.payloads(inline.get(channel, ()), by_id.get(channel, ()))
    ]


def persist(
    engine: Engine, request_rows: list[RequestRow], *batch_rows: dict[str, Any] | None
) -> list[str]:
    """One write in a transaction of its own, on a pooled connection (tools, tests)."""
    with engine.begin() as conn:
        written = write_results(conn, request_rows, *batch_rows)
    settle_jobs(engine, request_rows)
    return written
