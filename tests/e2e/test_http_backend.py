"""Gristmill in front of an existing single-item HTTP model service (the HTTP backend):
batched and queued in front of it, bounded concurrency, slow answers, failures that
open the circuit (503 + Retry-After for requests; jobs wait), and the service being
killed and started again in the middle of a job with nothing lost.

The upstream is a real HTTP server started by the test (bench/upstream.py). CI runs a
2,000-item job through a restart; the 100,000-item run is
``python -m bench.lifecycle http``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from bench.upstream import UpstreamProcess, upstream_output
from gristmill.devservices.stack import Services, System, build_system

pytestmark = pytest.mark.slow
PASSWORD = "s3cret-" + uuid.uuid4().hex[:8]
NAME = f"up-{uuid.uuid4().hex[:6]}"
CONCURRENCY = 4
WORKERS = 2


@pytest.fixture(scope="module")
def up(
    services: Services, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[System, UpstreamProcess]]:
    workdir: Path = tmp_path_factory.mktemp("http-backend")
    upstream = UpstreamProcess(workdir / "upstream.log", 2)
    upstream.start()
    env = {"GRISTMILL_HTTP_BREAKER_FAILURES": "3", "GRISTMILL_HTTP_BREAKER_OPEN_S": "1"}
    system = build_system(services, workdir, extra_env=env)
    # Credentials in the URL (the service ignores them): no tenant and no log may see them.
    config = {
        "url": upstream.url.replace("http://", f"http://svc:{PASSWORD}@") + "/predict",
        "request_template": {"text": "{{input}}"},
        "response_path": "result",
        "concurrency": CONCURRENCY,
        "timeout_ms": 2000,
    }
    try:
        for args in (
            [
                "register",
                f"{NAME}@1",
                "--backend",
                "http",
                "--max-batch",
                "32",
                "--config",
                json.dumps(config),
            ],
            ["promote", f"{NAME}@1"],
        ):
            r = subprocess.run(
                [sys.executable, "-m", "gristmill", "models", *args],
                env=system.env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert r.returncode == 0, r.stderr
        system.start_scheduler(workers=WORKERS, models=f"sim,{NAME}")
        system.url = system.start_api()
        system.wait_until_serving(NAME)
        yield system, upstream
    finally:
        system.close()
        upstream.kill()


def infer(system: System, text: str) -> httpx.Response:
    return httpx.post(
        f"{system.url}/v1/infer",
        json={"model": NAME, "input": text, "timeout_ms": 5000},
        headers=system.headers("paid"),
        timeout=30,
    )


def submit(system: System, texts: list[str]) -> str:
    r = httpx.post(
        f"{system.url}/v1/jobs",
        json={"model": NAME, "items": [{"input": t} for t in texts]},
        headers=system.headers("paid"),
        timeout=120,
    )
    assert r.status_code == 202, r.text
    return str(r.json()["job_id"])


def job(system: System, job_id: str) -> dict[str, Any]:
    return dict(httpx.get(f"{system.url}/v1/jobs/{job_id}", headers=system.headers("paid")).json())


def wait_job(system: System, job_id: str, timeout_s: float = 300) -> dict[str, Any]:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        j = job(system, job_id)
        if j["status"] in ("completed", "failed", "cancelled", "expired") and j["finished_at"]:
            return j
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} unfinished: {j}")


def results(system: System, job_id: str) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{system.url}/v1/jobs/{job_id}/results", headers=system.headers("paid"), timeout=300
    )
    return [orjson.loads(line) for line in r.content.splitlines() if line]


def test_sync_requests_are_batched_in_front_of_it_with_bounded_concurrency(
    up: tuple[System, UpstreamProcess],
) -> None:
    system, upstream = up
    texts = [f"hello {i}" for i in range(120)]
    with ThreadPoolExecutor(40) as pool:
        answers = list(pool.map(lambda t: infer(system, t), texts))
    assert all(a.status_code == 200 for a in answers), [
        a.text for a in answers if a.status_code != 200
    ][:3]
    assert [a.json()["output"] for a in answers] == [upstream_output(t) for t in texts]
    assert max(a.json()["batch_size"] for a in answers) > 1  # queued and batched in front
    assert upstream.stats()["inflight_max"] <= CONCURRENCY * WORKERS


def test_a_slow_upstream_still_answers(up: tuple[System, UpstreamProcess]) -> None:
    system, upstream = up
    upstream.control(delay_ms=300)
    try:
        r = infer(system, "slowly")
        assert r.status_code == 200 and r.json()["output"] == upstream_output("slowly")
        assert r.json()["timings"]["compute_ms"] >= 290
    finally:
        upstream.control(delay_ms=2)


def test_a_failing_upstream_opens_the_circuit_and_jobs_wait_for_it(
    up: tuple[System, UpstreamProcess],
) -> None:
    system, upstream = up
    upstream.control(fail_rate=1.0, status=503)
    try:
        deadline = time.time() + 30
        while True:
            r = infer(system, "while down")
            assert r.status_code in (503, 504), r.text  # never a wrong answer
            if r.status_code == 503 and "cannot be reached" in r.text:
                break
            assert time.time() < deadline, r.text
            time.sleep(0.3)
        assert r.headers.get("Retry-After")
        # The upstream's URL, its password and its failure text stay with operators.
        assert PASSWORD not in r.text and upstream.url.split("//")[1] not in r.text, r.text
        assert "HTTP 503" not in r.text
        for log in system.workdir.glob("*.log"):
            assert PASSWORD not in log.read_text(errors="replace"), log
        job_id = submit(system, [f"queued {i}" for i in range(300)])  # accepted while down
        time.sleep(3)
        assert job(system, job_id)["counts"]["failed"] == 0
    finally:
        upstream.control(fail_rate=0.0)
    done = wait_job(system, job_id)
    assert done["status"] == "completed" and done["counts"]["succeeded"] == 300
    got = [x["output"] for x in results(system, job_id)]
    assert got == [upstream_output(f"queued {i}") for i in range(300)]
    deadline = time.time() + 15
    while infer(system, "back").status_code != 200:
        assert time.time() < deadline
        time.sleep(0.3)


def test_a_job_survives_the_upstream_restarting(up: tuple[System, UpstreamProcess]) -> None:
    system, upstream = up
    n = 2000
    upstream.control(delay_ms=5)
    job_id = submit(system, [f"item {i}" for i in range(n)])
    deadline = time.time() + 120
    while job(system, job_id)["counts"]["succeeded"] < n // 5:
        assert time.time() < deadline
        time.sleep(0.2)
    upstream.kill()
    time.sleep(3)
    assert job(system, job_id)["counts"]["failed"] == 0
    upstream.start()
    done = wait_job(system, job_id)
    assert done["status"] == "completed", done
    assert done["counts"]["succeeded"] == n and done["counts"]["failed"] == 0
    got = [x["output"] for x in results(system, job_id)]
    assert got == [upstream_output(f"item {i}") for i in range(n)]
