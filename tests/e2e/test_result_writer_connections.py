"""The scheduler's result writer opens its persist threads' connections before the first
result (``ResultWriter.connect_ahead``): the threads' first writes take them instead of
connecting, and a database that cannot be reached yet costs the start nothing."""

from __future__ import annotations

import socket
import threading
import time

import psycopg

from results.db import libpq_url
from results.store import ResultWriter


def _backends(url: str) -> int:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def _backends_settle(url: str, want: int, timeout_s: float = 10.0) -> int:
    """The count once it reaches ``want`` (or the last seen at ``timeout_s``): a closed
    connection's backend leaves pg_stat_activity a moment after the client's close
    returns (one CI run on a loaded box saw it still there)."""
    end = time.monotonic() + timeout_s
    while (n := _backends(url)) != want and time.monotonic() < end:
        time.sleep(0.05)
    return n


def test_threads_write_on_the_connections_opened_ahead(database: str) -> None:
    writer = ResultWriter(database)
    try:
        assert writer.connect_ahead(3) == 3
        assert _backends(database) == 3
        done = threading.Barrier(3)

        def first_write() -> None:
            assert writer([], []) == []
            done.wait(10)  # each thread holds its connection: none takes another's

        threads = [threading.Thread(target=first_write) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert _backends(database) == 3  # no thread connected anew
        # A fourth thread finds no spare one left and connects itself.
        extra = threading.Thread(target=lambda: writer([], []))
        extra.start()
        extra.join(30)
        assert _backends(database) == 4
    finally:
        writer.close()
    assert _backends_settle(database, 0) == 0  # the spare and the taken ones alike


def test_spares_not_taken_are_closed_with_the_writer(database: str) -> None:
    writer = ResultWriter(database)
    assert writer.connect_ahead(2) == 2
    writer.close()
    assert _backends_settle(database, 0) == 0


def test_an_unreachable_database_opens_none_and_raises_nothing() -> None:
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    writer = ResultWriter(f"postgresql://gristmill@127.0.0.1:{port}/gristmill", connect_timeout_s=2)
    assert writer.connect_ahead(4) == 0
    writer.close()
