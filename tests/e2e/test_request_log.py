"""The request log in a real PostgreSQL: partitioned online, one row per request however
often it is delivered, retention by dropping partitions and by the sweeper (issue 19).

Each test here gets a database of its own on the session's PostgreSQL server, so
migrations can start from an old revision.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import numpy as np
import pytest
from sqlalchemy import Engine, text

from bench.store.batch_rows import request_row
from core.config import Settings
from gristmill.migrate import migrate_database
from results import store
from results.db import make_engine
from results.partitions import create as create_partition
from results.partitions import list_partitions
from results.retention import PARTITIONED, Slot, partition_name
from results.schema import RequestRow
from results.store import persist
from results.sweeper import Sweeper
from results.tenants import create_tenant, set_log_retention

DAY = timedelta(days=1)


def settings_for(url: str, **kw: Any) -> Settings:
    return Settings(database_url=url, allow_weak_durability=True, **kw)


# Columns of ``requests`` added after the revisions these tests start from (0015, 0018):
# the code that writes there is that revision's, whose rows lack them (deploy.md:
# schema first, so the writer of a release never meets a table without its columns).
LATER_COLUMNS = {"service_tier"}  # revision 0027


@pytest.fixture
def old_writer(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``persist`` writes the columns the old revision has, not ``LATER_COLUMNS``."""
    cols = tuple(c for c in store._REQUEST_COLUMNS if c[0] not in LATER_COLUMNS)
    monkeypatch.setattr(store, "_REQUEST_COLUMNS", cols)
    store.insert_statement.cache_clear()
    yield
    monkeypatch.undo()
    store.insert_statement.cache_clear()


def count(engine: Engine, sql: str, **params: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql), params).scalar_one())


@pytest.mark.usefixtures("old_writer")
def test_partitioning_is_online_and_keeps_every_row(database: str) -> None:
    """From the single table (revision 0014, before this log's revisions) with rows in
    it, to the partitioned log, while a writer keeps storing results the way the
    scheduler does: it is never refused and never waits long, and every row, old and
    new, is there once afterwards."""
    settings = settings_for(database)
    migrate_database(settings, "0014")
    engine = make_engine(database, pool_size=4)
    with engine.begin() as conn:
        # In that revision's own terms: today's table has columns it lacks.
        tenant = conn.execute(
            text("INSERT INTO tenants (name, tier) VALUES ('old', 'paid') RETURNING id::text")
        ).scalar_one()
        conn.execute(
            text(
                "INSERT INTO requests (request_id, tenant_id, priority, model, model_version, "
                "status, output, received_at, job_id, item_index) "
                "SELECT gen_random_uuid(), :t, 'paid', 'sim', '1', 'succeeded', "
                "jsonb_build_object('digest', i), now() - i * interval '1 minute', "
                "CASE WHEN i % 2 = 0 THEN gen_random_uuid() END, i "
                "FROM generate_series(1, 50000) i"
            ),
            {"t": tenant},
        )
    # Step 1 (additive): the code of this revision writes from here on.
    migrate_database(settings, "0015")
    written: list[str] = []
    waits: list[float] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            rows = [request_row(tenant, datetime.now(UTC)) for _ in range(32)]
            t = time.perf_counter()
            try:
                persist(engine, rows, None)
            except BaseException as exc:  # recorded: the assertion below names it
                errors.append(exc)
                return
            waits.append(time.perf_counter() - t)
            written.extend(r["request_id"] for r in rows)

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for th in threads:
        th.start()
    time.sleep(0.5)
    try:
        migrate_database(settings, "head")  # step 2: the swap, under writes
        time.sleep(0.5)
    finally:
        stop.set()
        for th in threads:
            th.join()
    assert errors == []
    assert max(waits) < 2.0, f"a write waited {max(waits):.2f} s"
    with engine.connect() as conn:
        assert (
            conn.execute(text("SELECT relkind FROM pg_class WHERE relname = 'requests'")).scalar()
            == "p"
        )
        parts, _ = list_partitions(conn, ["requests"])
        legacy = next(p for p in parts if p.name == "requests_legacy")
        assert legacy.lower is None and legacy.upper > datetime.now(UTC) + DAY
        # The old table's indexes were adopted, none built again beside them.
        idx = conn.execute(
            text(
                "SELECT indexrelid::regclass::text, indisvalid FROM pg_index "
                "WHERE indrelid = 'requests_legacy'::regclass ORDER BY 1"
            )
        ).all()
    assert sorted(i for i, _ in idx) == [
        "requests_legacy_job_item",
        "requests_legacy_pkey",
        "requests_legacy_received_brin",
        "requests_legacy_tenant_received",
    ]
    assert all(valid for _, valid in idx)
    total = count(engine, "SELECT count(*) FROM requests")
    assert total == 50_000 + len(written) and len(written) > 0
    assert count(engine, "SELECT count(DISTINCT request_id) FROM requests") == total
    rid = written[-1]
    assert count(engine, "SELECT count(*) FROM requests WHERE request_id = :r", r=rid) == 1
    engine.dispose()


def test_a_redelivered_result_meets_its_first_row_in_its_partition(database: str) -> None:
    """The same request stored again (Kafka redelivers after a crash between the write
    and the offset commit) keeps one row and the first answer, next to a partition
    boundary too; a request is keyed by (request_id, received_at), so every message of
    it must carry the same received_at (the API resends with the first one's)."""
    migrate_database(settings_for(database), "head")
    engine = make_engine(database, pool_size=2)
    with engine.begin() as conn:
        tenant = create_tenant(conn, "t", "paid").id
        parts, _ = list_partitions(conn, ["requests"])
    edge = max(p.upper for p in parts)  # the newest partition's end
    last = edge - timedelta(microseconds=1)
    first = [
        request_row(tenant, last),
        request_row(tenant, edge),
        request_row(tenant, datetime.now(UTC)),
    ]
    create_partition(
        engine,
        Slot("requests", partition_name("requests", edge, DAY), edge, edge + DAY),
        "received_at",
    )
    assert len(persist(engine, first, None)) == 3
    again = [cast(RequestRow, {**r, "output_vector": b"\x00" * 1536, "attempts": 2}) for r in first]
    assert persist(engine, again, None) == []  # nothing new written
    # A batch mixing a redelivered request with a new one writes only the new one.
    fresh = request_row(tenant, datetime.now(UTC))
    assert persist(engine, [again[2], fresh], None) == [fresh["request_id"]]
    with engine.connect() as conn:
        got = {
            r[0]: (r[1], r[2])
            for r in conn.execute(
                text("SELECT request_id::text, attempts, tableoid::regclass::text FROM requests")
            )
        }
    assert sorted(got) == sorted([*(r["request_id"] for r in first), fresh["request_id"]])
    assert {attempts for attempts, _ in got.values()} == {1}  # the first answer stands
    # The two rows either side of the boundary live in two partitions.
    assert got[first[0]["request_id"]][1] != got[first[1]["request_id"]][1]
    engine.dispose()


def test_the_sweeper_keeps_retention_and_partitions(database: str) -> None:
    now = datetime.now(UTC)
    settings = settings_for(database, request_log_retention_days=30, sweep_batch_rows=100)
    migrate_database(settings, "head")
    engine = make_engine(database, pool_size=4)
    with engine.begin() as conn:
        a = create_tenant(conn, "keeps-default", "paid").id
        b = create_tenant(conn, "keeps-a-week", "paid").id
        set_log_retention(conn, "keeps-a-week", 7)
        # A log long past its migration: the old table's partition is gone, days of
        # partitions behind now.
        for table in PARTITIONED:
            parts, _ = list_partitions(conn, [table])
            for p in parts:
                conn.execute(text(f"ALTER TABLE {table} DETACH PARTITION {p.name}"))
                conn.execute(text(f"DROP TABLE {p.name}"))
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    for d in range(-40, 1):
        lo = today + d * DAY
        for table, key in PARTITIONED.items():
            create_partition(engine, Slot(table, partition_name(table, lo, DAY), lo, lo + DAY), key)
    ages = (35, 20, 10, 3, 0)
    for tenant in (a, b):
        persist(
            engine, [request_row(tenant, now - d * DAY) for d in ages for _ in range(150)], None
        )
    # Two finished jobs of tenant a, 5 days old: one whose output expired yesterday.
    jobs = {}
    with engine.begin() as conn:
        for name, expires in (("expired", now - DAY), ("kept", now + DAY)):
            jobs[name] = str(uuid.uuid4())
            conn.execute(
                text(
                    "INSERT INTO jobs (job_id, tenant_id, model, model_version, total_items, "
                    "created_at, finished_at, expires_at, output_expires_at) VALUES "
                    "(:j, :t, 'sim', '1', 250, :c, :c, :c, :e)"
                ),
                {"j": jobs[name], "t": a, "c": now - 5 * DAY, "e": expires},
            )
            conn.execute(
                text(
                    "INSERT INTO job_items (job_id, item_index, input, request_id) "
                    "SELECT :j, i, '\"x\"', gen_random_uuid() FROM generate_series(0, 249) i"
                ),
                {"j": jobs[name]},
            )
        conn.execute(
            text(
                "INSERT INTO idempotency_keys (tenant_id, key, request_id, body_hash, "
                "deadline_at, created_at) VALUES "
                "(:t, 'old', gen_random_uuid(), 'h', now(), now() - interval '2 days'), "
                "(:t, 'new', gen_random_uuid(), 'h', now(), now())"
            ),
            {"t": a},
        )
    for job_id in jobs.values():
        persist(
            engine,
            [
                request_row(a, now - 5 * DAY, job_id=job_id, item_index=i, priority="jobs")
                for i in range(250)
            ],
            None,
        )
    with engine.begin() as conn:  # they finished when their rows were written, 5 days ago
        conn.execute(
            text("UPDATE jobs SET finished_at = :c WHERE job_id = ANY(:js)"),
            {"c": now - 5 * DAY, "js": list(jobs.values())},
        )

    leader, other = Sweeper(engine, settings), Sweeper(engine, settings)
    assert leader.try_lead() and not other.try_lead()
    report = leader.sweep(now)
    assert report.caught_up and report.errors == []

    def rows(tenant: str, days_old: int) -> int:
        at = now - days_old * DAY
        return count(
            engine,
            "SELECT count(*) FROM requests WHERE tenant_id = :t AND received_at = :at",
            t=tenant,
            at=at,
        )

    # Partitions older than 30 days dropped whole; the week-long tenant's rows deleted
    # past 7 days; everything else kept.
    assert [rows(a, d) for d in ages] == [0, 150, 150, 150, 150]
    assert [rows(b, d) for d in ages] == [0, 0, 0, 150, 150]
    dropped = {p for p in report.dropped if p.startswith("requests_")}
    assert partition_name("requests", today - 35 * DAY, DAY) in dropped
    assert partition_name("requests", today - 29 * DAY, DAY) not in dropped
    # Made ahead: the next 72 hours.
    with engine.connect() as conn:
        parts, _ = list_partitions(conn, ["requests"])
    assert max(p.upper for p in parts) >= now + timedelta(hours=72)
    # The expired job's results and items are gone and it says so; the other is whole.
    for name, want_rows, want_items in (("expired", 0, 0), ("kept", 250, 250)):
        j = jobs[name]
        assert count(engine, "SELECT count(*) FROM requests WHERE job_id = :j", j=j) == want_rows
        assert count(engine, "SELECT count(*) FROM job_items WHERE job_id = :j", j=j) == want_items
    with engine.connect() as conn:
        expired_at: dict[str, Any] = dict(
            conn.execute(text("SELECT job_id::text, output_expired_at FROM jobs")).all()
        )
    assert expired_at[jobs["expired"]] is not None and expired_at[jobs["kept"]] is None
    assert report.jobs_expired == 1
    assert count(engine, "SELECT count(*) FROM idempotency_keys") == 1
    # Nothing left to do on a second pass; the lock passes on when the leader goes.
    again = leader.sweep(now)
    assert again.rows_deleted == 0 and again.dropped == [] and again.created == []
    leader.release()
    assert other.try_lead()
    other.release()
    engine.dispose()


def _storage(engine: Engine, table: str) -> tuple[str, list[str]]:
    """(output_vector's attstorage, the table's reloptions) of ``table``."""
    with engine.connect() as conn:
        r = conn.execute(
            text(
                "SELECT a.attstorage, coalesce(c.reloptions, '{}') FROM pg_class c "
                "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'output_vector' "
                "WHERE c.relname = :t"
            ),
            {"t": table},
        ).one()
    return str(r[0]), list(r[1])


def _toast_bytes(engine: Engine, table: str) -> int:
    return count(
        engine,
        "SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE relname = :t",
        t=table,
    )


def _vector(engine: Engine, request_id: str) -> bytes:
    with engine.connect() as conn:
        return bytes(
            conn.execute(
                text("SELECT output_vector FROM requests WHERE request_id = :r"), {"r": request_id}
            ).scalar_one()
        )


@pytest.mark.usefixtures("old_writer")
def test_vectors_are_stored_external_and_rows_kept_in_the_heap(database: str) -> None:
    """Revision 0019 changes the storage of the partitions that exist, leaving the rows
    stored before as they were; a partition made afterwards has the same settings, and
    a 1,024-wide float32 vector written into it stays in the heap and reads back
    byte for byte."""
    settings = settings_for(database)
    migrate_database(settings, "0018")
    engine = make_engine(database, pool_size=2)
    with engine.begin() as conn:
        tenant = conn.execute(
            text("INSERT INTO tenants (name, tier) VALUES ('w', 'paid') RETURNING id::text")
        ).scalar_one()
    rng = np.random.default_rng(19)
    wide = [rng.standard_normal(1024, dtype=np.float32).tobytes() for _ in range(2)]
    now = datetime.now(UTC)
    old = request_row(tenant, now, output_vector=wide[0])
    persist(engine, [old], None)
    with engine.connect() as conn:
        (here,) = conn.execute(
            text("SELECT tableoid::regclass::text FROM requests WHERE request_id = :r"),
            {"r": old["request_id"]},
        ).one()
    assert _storage(engine, here)[0] == "x"  # EXTENDED before the revision
    assert _toast_bytes(engine, here) > 0  # a 4 KB vector went out of line

    migrate_database(settings)
    with engine.connect() as conn:
        parts, _ = list_partitions(conn, ["requests"])
    assert parts
    for p in parts:
        assert _storage(engine, p.name) == ("e", ["toast_tuple_target=8160"])
    assert _storage(engine, "requests")[0] == "e"
    assert _vector(engine, old["request_id"]) == wide[0]  # stored before, read the same

    last = max(p.upper for p in parts)
    fresh = Slot("requests", partition_name("requests", last, DAY), last, last + DAY)
    create_partition(engine, fresh, "received_at")
    assert _storage(engine, fresh.name) == ("e", ["toast_tuple_target=8160"])
    new = request_row(tenant, last + timedelta(hours=1), output_vector=wide[1])
    assert persist(engine, [new], None) == [new["request_id"]]
    assert _vector(engine, new["request_id"]) == wide[1]
    assert np.array_equal(
        np.frombuffer(_vector(engine, new["request_id"]), np.float32),
        np.frombuffer(wide[1], np.float32),
    )
    assert _toast_bytes(engine, fresh.name) == 0  # the row stayed in the heap
    engine.dispose()
