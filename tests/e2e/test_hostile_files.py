"""OpenAI Files with a budget, and limits counted per API instance, over real HTTP and
PostgreSQL with the unmodified ``openai`` SDK where it applies.

One API instance of two uvicorn processes (as ``gristmill api --workers 2`` runs it), no
scheduler (nothing here needs a model to run), small per-tier budgets for the free tier.
Each test makes tenants of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest
from sqlalchemy import event, text

from gristmill.devservices.stack import Services, System, build_system
from ingest.openai import batch_wire as bw
from results import files as files_db
from results.db import make_async_engine, make_engine
from results.sweeper import Sweeper
from results.tenants import create_tenant, issue_key, set_plan

FREE_FILES, FREE_BYTES, FREE_PER_MIN = 3, 40_000_000, 12
ENV = {
    "GRISTMILL_TIER_FILE_COUNT": json.dumps(
        {"free": FREE_FILES, "paid": 1000, "enterprise": 10000}
    ),
    "GRISTMILL_TIER_FILE_BYTES": json.dumps(
        {"free": FREE_BYTES, "paid": 10**10, "enterprise": 10**11}
    ),
    "GRISTMILL_TIER_FILE_UPLOADS_PER_MIN": json.dumps(
        {"free": FREE_PER_MIN, "paid": 600, "enterprise": 6000}
    ),
    "GRISTMILL_TIER_MAX_STREAMS": json.dumps({"free": 2, "paid": 16, "enterprise": 64}),
    "GRISTMILL_UPLOAD_IDLE_TIMEOUT_S": "4",
}
PROCESSES = 2


@pytest.fixture(scope="module")
def fsys(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    s = build_system(services, tmp_path_factory.mktemp("files"), extra_env=ENV)
    try:
        s.url = s.start_api(processes=PROCESSES)
        time.sleep(1.0)  # both processes have counted each other (rates are split by them)
        yield s
    finally:
        s.close()


def new_key(s: System, tier: str = "free") -> tuple[str, str]:
    """(key, tenant id) of a fresh tenant without request limits."""
    engine = make_engine(s.settings.database_url)
    with engine.begin() as conn:
        t = create_tenant(conn, f"{tier}-{uuid.uuid4().hex[:8]}", tier)
        set_plan(conn, t.name, rate_rps=1e6, burst=1e6, job_items_per_s=1e9)
        key = issue_key(conn, t)[1]
    engine.dispose()
    return key, t.id


def sdk(s: System, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key=key, max_retries=0)


def jsonl(n: int, pad: int = 0) -> bytes:
    return b"".join(
        json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/infer",
                    "body": {"model": "sim", "input": f"line {i}" + "x" * pad}}).encode() + b"\n"
        for i in range(n)
    )  # fmt: skip


def stored(s: System, tenant_id: str) -> tuple[int, int]:
    """(files, chunks) the tenant has in PostgreSQL, expired or not."""
    engine = make_engine(s.settings.database_url)
    with engine.connect() as conn:
        files = conn.execute(
            text("SELECT count(*) FROM stored_files WHERE tenant_id = :t"), {"t": tenant_id}
        ).scalar_one()
        chunks = conn.execute(
            text(
                "SELECT count(*) FROM stored_file_chunks c JOIN stored_files f "
                "USING (file_id) WHERE f.tenant_id = :t"
            ),
            {"t": tenant_id},
        ).scalar_one()
    engine.dispose()
    return int(files), int(chunks)


# --- expiry -------------------------------------------------------------------------------


def test_openais_expires_after_is_kept_and_a_default_applies(fsys: System) -> None:
    key, _ = new_key(fsys, "paid")
    c = sdk(fsys, key)
    f = c.files.create(
        file=("in.jsonl", jsonl(2)),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": 3600},
    )
    assert f.expires_at is not None and f.expires_at - f.created_at in (3600, 3601)
    assert c.files.retrieve(f.id).expires_at == f.expires_at
    g = c.files.create(file=("in.jsonl", jsonl(2)), purpose="batch")
    assert g.expires_at is not None and abs(g.expires_at - g.created_at - 30 * 86400) <= 1
    with pytest.raises(openai.BadRequestError) as e:
        c.files.create(
            file=("in.jsonl", jsonl(2)),
            purpose="batch",
            expires_after={"anchor": "created_at", "seconds": 60},
        )
    assert e.value.body["param"] == "expires_after[seconds]"  # type: ignore[index]


def test_an_expired_file_is_gone_at_once_and_the_sweeper_deletes_it(fsys: System) -> None:
    key, tid = new_key(fsys, "paid")
    c = sdk(fsys, key)
    f = c.files.create(file=("in.jsonl", jsonl(3)), purpose="batch")
    engine = make_engine(fsys.settings.database_url)
    with engine.begin() as conn:  # as if its hour had passed
        conn.execute(
            text(
                "UPDATE stored_files SET expires_at = now() - interval '1 second' "
                "WHERE file_id = :f"
            ),
            {"f": f.id},
        )
    with pytest.raises(openai.NotFoundError):
        c.files.retrieve(f.id)
    with pytest.raises(openai.NotFoundError):
        c.files.content(f.id)
    assert f.id not in {x.id for x in c.files.list()}
    with pytest.raises(openai.NotFoundError):
        c.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")
    assert stored(fsys, tid) == (1, 1)
    report = Sweeper(engine, fsys.settings).sweep()
    engine.dispose()
    assert report.files_deleted >= 1 and not report.errors
    assert stored(fsys, tid) == (0, 0)


# --- content ------------------------------------------------------------------------------


def test_a_batch_file_that_is_not_jsonl_is_refused_before_any_of_it_is_stored(
    fsys: System,
) -> None:
    key, tid = new_key(fsys, "paid")
    c = sdk(fsys, key)
    for _ in range(3):  # the report: 3 x 20 MB of random bytes stored in PostgreSQL
        with pytest.raises(openai.BadRequestError) as e:
            # Led by a byte that is not a newline: random bytes start with one once in 256
            # uploads, and a blank line is skipped (the refusal then names line 2).
            noise = b"\xff" + os.urandom(20_000_000)
            c.files.create(file=("r.bin", noise), purpose="batch")
        assert "line 1" in e.value.message and e.value.body["param"] == "file"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="line 3"):
        c.files.create(file=("in.jsonl", jsonl(2) + b"[1, 2]\n" + jsonl(1)), purpose="batch")
    assert stored(fsys, tid) == (0, 0)


# --- the budget ----------------------------------------------------------------------------


def test_a_tenant_keeps_at_most_its_tiers_files(fsys: System) -> None:
    key, tid = new_key(fsys)
    c = sdk(fsys, key)
    made = [
        c.files.create(file=(f"{i}.jsonl", jsonl(1)), purpose="batch") for i in range(FREE_FILES)
    ]
    with pytest.raises(openai.PermissionDeniedError) as e:
        c.files.create(file=("more.jsonl", jsonl(1)), purpose="batch")
    assert e.value.status_code == 403 and e.value.body["code"] == "quota_exceeded"  # type: ignore[index]
    assert f"{FREE_FILES} files" in e.value.message
    c.files.delete(made[0].id)  # deleting makes room
    c.files.create(file=("again.jsonl", jsonl(1)), purpose="batch")
    assert stored(fsys, tid)[0] == FREE_FILES


def test_a_tenant_stores_at_most_its_tiers_bytes(fsys: System) -> None:
    key, tid = new_key(fsys)
    c = sdk(fsys, key)
    big = jsonl(30_000, pad=1_000)  # ~31 MB
    assert len(big) < FREE_BYTES < 2 * len(big)
    c.files.create(file=("big.jsonl", big), purpose="batch")
    t0 = time.monotonic()
    with pytest.raises(openai.PermissionDeniedError) as e:
        c.files.create(file=("big2.jsonl", big), purpose="batch")
    assert e.value.body["code"] == "quota_exceeded" and "free" in e.value.message  # type: ignore[index]
    assert time.monotonic() - t0 < 30
    assert stored(fsys, tid)[0] == 1
    c.files.create(file=("small.jsonl", jsonl(10)), purpose="batch")  # what fits still goes


def test_uploads_are_rate_limited_per_key_with_retry_after(fsys: System) -> None:
    key, _ = new_key(fsys)
    c = sdk(fsys, key)
    codes: list[int] = []
    retry_after = None
    for i in range(3 * FREE_PER_MIN):
        try:
            f = c.files.create(file=(f"{i}.jsonl", jsonl(1)), purpose="batch")
            c.files.delete(f.id)  # stay under the file count
            codes.append(200)
        except openai.RateLimitError as exc:
            codes.append(429)
            retry_after = exc.response.headers.get("Retry-After")
    # 60 files in 1.4 s were taken before; now a minute's worth at most, then 429s.
    assert codes.count(200) <= FREE_PER_MIN and 429 in codes, codes
    assert retry_after is not None and int(retry_after) >= 1


# --- per instance, across its processes -----------------------------------------------


def stalled_upload(s: System, key: str) -> socket.socket:
    """A JSONL job upload that sends a little of its body and then nothing."""
    u = httpx.URL(s.url)
    sock = socket.create_connection((u.host, u.port or 80), timeout=10)
    sock.sendall(
        (
            f"POST /v1/jobs?model=sim HTTP/1.1\r\nHost: {u.host}\r\nAuthorization: Bearer {key}"
            "\r\nContent-Type: application/x-ndjson\r\nContent-Length: 1000000\r\n\r\n"
        ).encode()
        + b'{"input": "a"}\n'
    )
    return sock


def answered_at_once(sock: socket.socket, wait_s: float) -> int | None:
    """The status the server answered within ``wait_s``, or None (still reading)."""
    sock.settimeout(wait_s)
    try:
        data = sock.recv(65536)
    except TimeoutError:
        return None
    return int(data.split(b" ", 2)[1]) if data else None


def test_a_key_holds_its_uploads_per_instance_not_per_process(fsys: System) -> None:
    key, _ = new_key(fsys)
    per_key = fsys.settings.max_uploads_per_tenant  # 2, as the README says
    socks = [stalled_upload(fsys, key) for _ in range(3 * per_key)]
    try:
        time.sleep(1.0)
        statuses = [answered_at_once(s, 0.5) for s in socks]
    finally:
        for s in socks:
            s.close()
    held = [x for x in statuses if x is None]
    assert len(held) == per_key, statuses  # was per_key in each of the processes
    assert set(statuses) - {None} == {429}, statuses


def test_streams_are_capped_per_key_on_the_instance(fsys: System) -> None:
    key, _ = new_key(fsys, "free")  # tier_max_streams here: 2 for free
    c = sdk(fsys, key)
    f = c.files.create(file=("big.jsonl", jsonl(30_000, pad=1_000)), purpose="batch")
    url = f"{fsys.url}/v1/files/{f.id}/content"
    headers = {"Authorization": f"Bearer {key}"}

    async def hold_two_then_third() -> tuple[list[int], int, str | None]:
        async with httpx.AsyncClient(timeout=30) as client:
            held = []
            try:
                for _ in range(2):  # read nothing: the server waits on the socket
                    r = await client.send(
                        client.build_request("GET", url, headers=headers), stream=True
                    )
                    held.append(r)
                third = await client.get(url, headers=headers)
                return (
                    [r.status_code for r in held],
                    third.status_code,
                    third.headers.get("Retry-After"),
                )
            finally:
                for r in held:
                    await r.aclose()

    first, third, retry_after = asyncio.run(hold_two_then_third())
    assert first == [200, 200] and third == 429 and retry_after is not None
    r = httpx.get(url, headers=headers, timeout=60)  # given back when they closed
    assert r.status_code == 200 and len(r.content) == f.bytes


# --- GET /v1/batches ------------------------------------------------------------------------


def test_a_page_of_batches_is_read_in_a_constant_number_of_statements(fsys: System) -> None:
    key, tid = new_key(fsys, "paid")
    engine = make_engine(fsys.settings.database_url)
    with engine.begin() as conn:
        for i in range(120):
            job_id = str(uuid.uuid4())
            conn.execute(
                text(
                    "INSERT INTO jobs (job_id, tenant_id, model, model_version, total_items, "
                    "expires_at, submit_state, created_at) VALUES (:j, :t, 'sim', '1', 1, "
                    "now() + interval '1 day', 'submitted', now() - make_interval(secs => :i))"
                ),
                {"j": job_id, "t": tid, "i": i},
            )
            conn.execute(
                text(
                    "INSERT INTO openai_batches (batch_id, tenant_id, job_id, endpoint, "
                    "input_file_id, completion_window, created_at) VALUES (:b, :t, :j, "
                    "'/v1/infer', 'file-x', '24h', now() - make_interval(secs => :i))"
                ),
                {"b": bw.batch_id_for(job_id), "t": tid, "j": job_id, "i": i},
            )
    engine.dispose()

    async def statements(after: str | None, limit: int) -> tuple[int, int]:
        aengine = make_async_engine(fsys.settings.database_url)
        seen = []
        event.listen(aengine.sync_engine, "before_cursor_execute", lambda *a: seen.append(1))
        try:
            page = await files_db.batch_page(aengine, tid, after, limit)
        finally:
            await aengine.dispose()
        assert page is not None
        return len(seen), len(page)

    one, hundred = asyncio.run(statements(None, 1)), asyncio.run(statements(None, 100))
    assert one == (2, 1) and hundred == (2, 100)  # a query per batch was ~136 a page
    c = sdk(fsys, key)
    page = c.batches.list(limit=100)
    assert len(page.data) == 100 and page.has_more
    rest = c.batches.list(limit=100, after=page.data[-1].id)
    assert len(rest.data) == 20 and not rest.has_more
    assert asyncio.run(statements(page.data[-1].id, 100)) == (3, 20)
