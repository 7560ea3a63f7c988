"""A write's announcements on a real PostgreSQL (decision 70): each sync answer on the
reply channel its row names (else the shared channel), sent after the rows' commit, so
whoever hears an answer can already read its row; a redelivered write announces by id."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
from sqlalchemy import Engine

from bench.store.batch_rows import request_row
from results import announce
from results.db import RESULTS_CHANNEL, libpq_url, reply_channel
from results.schema import RequestRow
from results.store import write_on
from results.tenants import create_tenant


def sync_row(tenant: str, i: int, reply_to: str | None) -> RequestRow:
    row = request_row(tenant, datetime.now(UTC), output={"i": i}, output_vector=None)
    if reply_to is not None:
        row["reply_to"] = reply_to
    return row


def test_answers_go_to_their_channels_once_their_rows_can_be_read(
    engine: Engine, database: str
) -> None:
    dsn = libpq_url(database)
    with engine.begin() as conn:
        tenant = create_tenant(conn, "announced", "paid").id
    mine = reply_channel("0a1b2c3d")
    rows = [sync_row(tenant, 0, mine), sync_row(tenant, 1, None)]
    heard: dict[str, list[Any]] = {}
    with (
        psycopg.connect(dsn, autocommit=True) as listener,
        psycopg.connect(dsn, autocommit=True) as reader,
        psycopg.connect(dsn) as writer,
    ):
        listener.execute(f"LISTEN {mine}")
        listener.execute(f"LISTEN {RESULTS_CHANNEL}")
        written = write_on(writer, list(rows), [], commit=True)
        assert sorted(written) == sorted(r["request_id"] for r in rows)
        for note in listener.notifies(timeout=5, stop_after=2):
            answers, ids = announce.parse(note.payload)
            heard.setdefault(note.channel, []).extend([str(a["request_id"]) for a in answers] + ids)
            # Heard, so committed: another connection reads every row it names.
            for rid in heard[note.channel]:
                found = reader.execute(
                    "SELECT status FROM requests WHERE request_id = %s", (rid,)
                ).fetchone()
                assert found == ("succeeded",)
        assert heard == {mine: [rows[0]["request_id"]], RESULTS_CHANNEL: [rows[1]["request_id"]]}

        # The same write again (a redelivery): nothing new, each announced by id on its
        # own channel, for a waiter that registered after the first announcement.
        assert write_on(writer, list(rows), [], commit=True) == []
        again = {
            n.channel: announce.parse(n.payload) for n in listener.notifies(timeout=5, stop_after=2)
        }
        assert again == {
            mine: ([], [rows[0]["request_id"]]),
            RESULTS_CHANNEL: ([], [rows[1]["request_id"]]),
        }
