"""A job's counters advanced by several result writers at once, on a real PostgreSQL
(decision 64): no writer waits for another's commit, the job is finished exactly once by
whichever commits its last results, a redelivered write counts nothing twice, and a
reader sees the counts as they stand at every moment."""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, text

from bench.store.batch_rows import request_row
from core.vocab import RequestStatus
from results.db import libpq_url, make_async_engine
from results.job_items import give_new_request_ids
from results.jobs import job_rows, lock_job, settle, start_attempt
from results.schema import RequestRow, jobs
from results.store import write_on
from results.tenants import create_tenant

ITEMS = 400


def new_job(engine: Engine, total: int = ITEMS) -> tuple[str, str, list[str]]:
    """A submitted job of ``total`` items: (tenant, job, the items' request ids)."""
    job = str(uuid.uuid4())
    rids = [str(uuid.uuid4()) for _ in range(total)]
    with engine.begin() as conn:
        tenant = create_tenant(conn, f"t-{job[:8]}", "paid").id
        conn.execute(
            text(
                "INSERT INTO jobs (job_id, tenant_id, model, model_version, total_items, "
                "submit_state, expires_at, webhook_url) VALUES (:j, :t, 'sim', '1', :n, "
                "'submitted', now() + interval '1 day', 'https://hooks.example/x')"
            ),
            {"j": job, "t": tenant, "n": total},
        )
        conn.execute(
            text(
                "INSERT INTO job_items (job_id, item_index, input, request_id) "
                "SELECT :j, i, '\"x\"', (CAST(:r AS uuid[]))[i + 1] "
                "FROM generate_series(0, :n - 1) i"
            ),
            {"j": job, "r": rids, "n": total},
        )
    return tenant, job, rids


def rows(tenant: str, job: str, rids: list[str], indexes: range, status: str) -> list[RequestRow]:
    at = datetime.now(UTC)
    return [
        request_row(
            tenant,
            at,
            request_id=rids[i],
            priority="jobs",
            model="sim",
            params={},
            input="x",
            status=RequestStatus(status),
            output={"i": i},
            output_vector=None,
            job_id=job,
            item_index=i,
            deadline_at=at + timedelta(seconds=60),
            kafka_offset=i,
            service_tier=None,
        )
        for i in indexes
    ]


def job(engine: Engine, job_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(job_rows().where(jobs.c.job_id == job_id)).one()


def counts_rows(engine: Engine, job_id: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM job_counts WHERE job_id = :j"), {"j": job_id}
            ).scalar_one()
        )


def in_thread(fn: Any) -> Any:
    """Run ``fn`` in a thread of its own (its own writer id), return its result."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(30)
    assert out, "the write did not finish"
    return out[0]


@pytest.mark.slow
def test_writers_of_one_job_never_wait_and_the_last_commit_finishes_it(engine: Engine) -> None:
    tenant, job_id, rids = new_job(engine)
    url = libpq_url(str(engine.url.render_as_string(hide_password=False)))
    half = ITEMS // 2
    # Writer A counts the first half and holds its transaction open.
    a = psycopg.connect(url, autocommit=False)
    write_on(a, rows(tenant, job_id, rids, range(half), "succeeded"), [], commit=False)

    # Writer B, meanwhile, stores and commits the rest without waiting for A (a wait
    # would hit the lock timeout): the job row is not locked by A's counts.
    def b() -> list[str]:
        with psycopg.connect(url, autocommit=False) as pg:
            pg.execute("SET lock_timeout = '2s'")
            pg.commit()
            return write_on(
                pg, rows(tenant, job_id, rids, range(half, ITEMS), "failed"), [], commit=True
            )

    assert len(in_thread(b)) == ITEMS - half
    mid = job(engine, job_id)
    # B's counts show; A's do not yet; the job has started and is not finished.
    assert (mid.succeeded, mid.failed) == (0, ITEMS - half)
    assert mid.started_at is not None and mid.finished_at is None

    # A commits last: its settle sees B's counts and finishes the job, once.

    a.commit()
    settle(a.cursor(), [job_id])
    a.commit()
    a.close()
    done = job(engine, job_id)
    assert (done.succeeded, done.failed, done.expired, done.cancelled) == (half, ITEMS - half, 0, 0)
    assert done.finished_at is not None and done.webhook_next_at is not None
    # Folded into the job row: the writers' counts are gone and the row holds the totals.
    assert counts_rows(engine, job_id) == 0
    with engine.connect() as conn:
        raw = conn.execute(
            text("SELECT succeeded, failed FROM jobs WHERE job_id = :j"), {"j": job_id}
        ).one()
    assert tuple(raw) == (half, ITEMS - half)


@pytest.mark.slow
def test_a_redelivered_write_counts_nothing_twice_and_settles(engine: Engine) -> None:
    tenant, job_id, rids = new_job(engine, total=10)
    url = libpq_url(str(engine.url.render_as_string(hide_password=False)))
    first = rows(tenant, job_id, rids, range(10), "succeeded")
    with psycopg.connect(url, autocommit=False) as pg:
        write_on(pg, first[:6], [], commit=True)
        # Kafka redelivers the first six with four new ones: six were stored already.
        written = write_on(pg, first, [], commit=True)
    assert len(written) == 4
    j = job(engine, job_id)
    assert j.succeeded == 10 and j.finished_at is not None
    finished_at = j.finished_at
    # Again, after the finish: nothing moves.
    with psycopg.connect(url, autocommit=False) as pg:
        assert write_on(pg, first, [], commit=True) == []
    again = job(engine, job_id)
    assert again.succeeded == 10 and again.finished_at == finished_at


@pytest.mark.slow
def test_many_writers_at_once_count_every_item_exactly(engine: Engine) -> None:
    tenant, job_id, rids = new_job(engine, total=ITEMS)
    url = libpq_url(str(engine.url.render_as_string(hide_password=False)))
    statuses = ("succeeded", "failed", "expired", "cancelled")
    parts = [range(k, ITEMS, 8) for k in range(8)]
    barrier = threading.Barrier(len(parts))

    def writer(k: int) -> None:
        mine = rows(tenant, job_id, rids, parts[k], statuses[k % 4])
        with psycopg.connect(url, autocommit=False) as pg:
            barrier.wait()
            for chunk in range(0, len(mine), 10):  # many small commits, interleaved
                write_on(pg, mine[chunk : chunk + 10], [], commit=True)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(len(parts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    j = job(engine, job_id)
    assert (j.succeeded, j.failed, j.expired, j.cancelled) == (ITEMS // 4,) * 4
    assert j.finished_at is not None and counts_rows(engine, job_id) == 0


@pytest.mark.slow
def test_a_retry_committing_during_a_settle_keeps_its_reset_counters(engine: Engine) -> None:
    """A settle reads the counts (the old attempt complete: 'finished') and then waits for
    the job row, which a retry holds; the retry commits a new attempt with its counters
    reset. The settle must not fold the old attempt's totals into the new attempt."""
    tenant, job_id, rids = new_job(engine, total=10)
    url = libpq_url(str(engine.url.render_as_string(hide_password=False)))
    # The old attempt: 4 succeeded, 6 expired, counted (not yet settled).
    with psycopg.connect(url, autocommit=False) as pg:
        write_on(pg, rows(tenant, job_id, rids, range(4), "succeeded"), [], commit=False)
        write_on(pg, rows(tenant, job_id, rids, range(4, 10), "expired"), [], commit=False)
        pg.commit()
    redo = list(range(4, 10))
    locked = threading.Event()
    release = threading.Event()

    async def retry() -> None:
        aeng = make_async_engine(engine.url.render_as_string(hide_password=False), pool_size=1)
        try:
            async with aeng.begin() as conn:
                j = await lock_job(conn, tenant, job_id)
                assert j is not None
                await give_new_request_ids(conn, job_id, 1, redo, [str(uuid.uuid4()) for _ in redo])
                await start_attempt(conn, j, 1, datetime.now(UTC), succeeded=4)
                locked.set()
                await asyncio.to_thread(release.wait, 30)
        finally:
            await aeng.dispose()

    retrying = threading.Thread(target=lambda: asyncio.run(retry()))
    retrying.start()
    assert locked.wait(30)

    def settle_now() -> None:
        with psycopg.connect(url, autocommit=False) as pg:
            settle(pg.cursor(), [job_id])  # reads 'finished', then waits for the row
            pg.commit()

    settling = threading.Thread(target=settle_now)
    settling.start()
    settling.join(1.0)
    assert settling.is_alive(), "the settle should be waiting for the retry's lock"
    release.set()
    retrying.join(30)
    settling.join(30)
    j = job(engine, job_id)
    assert (j.attempt, j.succeeded, j.failed, j.expired, j.cancelled) == (1, 4, 0, 0, 0)
    assert j.finished_at is None
