"""The Python client, the jobs CLI, and job submission surviving an API crash."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from gristmill_client import AsyncClient, Client, GristmillHTTPError
from sqlalchemy import select

from core.models.sim import sim_output
from gristmill.devservices.stack import System
from results.db import make_engine
from results.schema import job_items, jobs


def test_client_infer_and_job_round_trip(system: System) -> None:
    with Client(system.url, system.keys["paid"]) as gm:
        out = gm.infer("sim", "via the client")
        assert out["output"] == sim_output("via the client")
        job = gm.submit_job("sim", [f"sdk {i}" for i in range(300)])
        done = gm.wait(job["job_id"], poll_s=0.3, timeout_s=120)
        assert done["status"] == "completed"
        results = list(gm.iter_results(job["job_id"]))
        assert [r["output"] for r in results] == [sim_output(f"sdk {i}") for i in range(300)]
        with pytest.raises(GristmillHTTPError) as exc:
            gm.infer("sim", "")
        assert exc.value.status == 400 and exc.value.field == "input"


def test_async_client(system: System) -> None:
    async def run() -> list[dict[str, object]]:
        async with AsyncClient(system.url, system.keys["paid"]) as gm:
            outs = await asyncio.gather(*[gm.infer("sim", f"async {i}") for i in range(20)])
            job = await gm.submit_job("sim", [{"input": "x", "custom_id": "only"}])
            await gm.wait(job["job_id"], poll_s=0.3, timeout_s=60)
            items = [r async for r in gm.iter_results(job["job_id"])]
            assert items[0]["custom_id"] == "only"
            return list(outs)

    outs = asyncio.run(run())
    assert [o["output"] for o in outs] == [sim_output(f"async {i}") for i in range(20)]


def test_cli_submit_wait_and_download(system: System, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(orjson.dumps({"input": f"cli {i}"}) + b"\n" for i in range(500)))
    env = {**os.environ, "GRISTMILL_URL": system.url, "GRISTMILL_API_KEY": system.keys["paid"]}
    cli = [sys.executable, "-m", "gristmill", "jobs"]
    r = subprocess.run(
        [*cli, "submit", str(src), "--model", "sim", "--wait"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.split()[1].rstrip(":")
    assert '"status": "completed"' in r.stdout
    out = tmp_path / "out.jsonl"
    r = subprocess.run(
        [*cli, "results", job_id, "-o", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    lines = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert [x["output"] for x in lines] == [sim_output(f"cli {i}") for i in range(500)]
    listed = subprocess.run([*cli, "list"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert job_id in listed.stdout


def _slow_upload(n: int, tag: str, pause_every: int, pause_s: float) -> Iterator[bytes]:
    for i in range(n):
        if i and i % pause_every == 0:
            time.sleep(pause_s)
        yield orjson.dumps({"input": f"{tag}-{i}"}) + b"\n"


def _tenant_jobs(system: System, tier: str) -> list[tuple[str, str, int]]:
    with make_engine(system.settings.database_url).connect() as conn:
        return [
            (str(r.job_id), r.submit_state, r.total_items)
            for r in conn.execute(
                select(jobs.c.job_id, jobs.c.submit_state, jobs.c.total_items).where(
                    jobs.c.tenant_id == system.tenant_ids[tier]
                )
            )
        ]


def _post_in_thread(url: str, key: str, body: Iterator[bytes]) -> threading.Thread:
    def run() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the API is killed under it
            httpx.post(
                f"{url}/v1/jobs?model=sim",
                content=body,
                timeout=120,
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/x-ndjson"},
            )

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.slow
def test_api_killed_mid_upload_leaves_no_job(system: System) -> None:
    url = system.start_api("api-crash-1")
    before = _tenant_jobs(system, "enterprise")
    t = _post_in_thread(
        url, system.keys["enterprise"], _slow_upload(5000, "crash1", pause_every=500, pause_s=0.3)
    )
    time.sleep(1.0)  # mid-upload: items are being copied, the job row is not written yet
    system.stop("api-crash-1", sig=signal.SIGKILL)
    t.join(10)
    time.sleep(1.0)
    assert _tenant_jobs(system, "enterprise") == before
    with make_engine(system.settings.database_url).connect() as conn:
        known = {j for j, _, _ in before}
        orphans = conn.execute(select(job_items.c.job_id).distinct()).all()
        assert all(str(r[0]) in known or _is_other_tenant(system, str(r[0])) for r in orphans)


def _is_other_tenant(system: System, job_id: str) -> bool:
    with make_engine(system.settings.database_url).connect() as conn:
        row = conn.execute(select(jobs.c.tenant_id).where(jobs.c.job_id == job_id)).first()
    return row is not None and str(row[0]) != system.tenant_ids["enterprise"]


@pytest.mark.slow
def test_api_killed_after_recording_leaves_a_job_that_completes(system: System) -> None:
    # A second API finishes submissions whose heartbeat is 2 s stale.
    rescuer = system.start_api("api-rescuer", env={"GRISTMILL_SUBMIT_STALE_S": "2"})
    victim = system.start_api("api-crash-2")
    tag = f"crash2-{uuid.uuid4().hex[:6]}"
    n = 30_000
    before = {j for j, _, _ in _tenant_jobs(system, "enterprise")}
    t = _post_in_thread(victim, system.keys["enterprise"], _slow_upload(n, tag, n + 1, 0))
    deadline = time.time() + 60
    job_id = None
    while time.time() < deadline and job_id is None:
        new = [j for j in _tenant_jobs(system, "enterprise") if j[0] not in before]
        if new and new[0][1] == "submitting":
            job_id = new[0][0]
        time.sleep(0.02)
    assert job_id is not None, "never saw the job between its two phases"
    system.stop("api-crash-2", sig=signal.SIGKILL)
    t.join(10)
    with Client(rescuer, system.keys["enterprise"]) as gm:
        done = gm.wait(job_id, poll_s=1, timeout_s=240)
        assert done["status"] == "completed" and done["counts"]["succeeded"] == n
        got = [r["output"] for r in gm.iter_results(job_id)]
    assert got == [sim_output(f"{tag}-{i}") for i in range(n)]
    system.stop("api-rescuer")
