"""A scheduler whose buffer is full stops reading without dropping what Kafka's client
prefetched, and still hands partitions over when the group rebalances
(scheduler/core/backpressure.py ``lane_hold``)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.models.sim import sim_output
from gristmill.devservices.stack import Services, System, build_system

# A jobs budget of 10 items (a quarter of the buffer) against 160 queued, 8 a batch of
# 1.2 s: the jobs lane is over budget almost all the time, holds, and holds long enough
# (past HOLD_MAX_S) to pause.
N = 160
ENV = {"GRISTMILL_MAX_BUFFERED": "40", "GRISTMILL_SIM_MAX_BATCH": "8"}


@pytest.fixture(scope="module")
def small_buffer(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    workdir: Path = tmp_path_factory.mktemp("backpressure")
    system = build_system(services, workdir, sim_batch_ms=1200, extra_env=ENV)
    try:
        system.start_scheduler("s1", workers=1, models="sim")
        system.url = system.start_api()
        system.wait_until_serving("sim")
        yield system
    finally:
        system.close()


def _job(system: System, n: int) -> str:
    r = httpx.post(
        f"{system.url}/v1/jobs",
        json={"model": "sim", "items": [{"input": f"held {i}"} for i in range(n)]},
        headers=system.headers("paid"),
        timeout=60,
    )
    assert r.status_code == 202, r.text
    return str(r.json()["job_id"])


def _wait(system: System, job_id: str, timeout_s: float) -> dict[str, object]:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        j = httpx.get(f"{system.url}/v1/jobs/{job_id}", headers=system.headers("paid")).json()
        if j["finished_at"]:
            return dict(j)
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} not finished: {j}")


def test_a_held_lane_loses_nothing_and_still_hands_over_its_partitions(
    small_buffer: System,
) -> None:
    system = small_buffer
    job_id = _job(system, N)
    time.sleep(3)  # s1 is reading the job, held at its budget
    assigned_at = time.time()
    system.start_scheduler("s2", workers=1, models="sim")
    # The group rebalances while s1's jobs lane holds: s2 must get partitions of the
    # jobs topic soon (a held lane pauses within HOLD_MAX_S and serves the rebalance).
    log2 = system.workdir / "s2.log"
    deadline = time.time() + 30
    while time.time() < deadline:
        text = log2.read_text() if log2.exists() else ""
        if re.search(r"jobs lane: assigned \[\(.*\.jobs", text):
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the second scheduler never got a jobs partition")
    handover_s = time.time() - assigned_at
    j = _wait(system, job_id, 180)
    counts = j["counts"]
    assert isinstance(counts, dict)
    assert counts["succeeded"] == N and counts["failed"] == 0, counts
    r = httpx.get(
        f"{system.url}/v1/jobs/{job_id}/results", headers=system.headers("paid"), timeout=60
    )
    lines = [ln for ln in r.text.splitlines() if ln]
    assert len(lines) == N
    assert str(sim_output("held 0")["digest"]) in lines[0]
    # s1 held its jobs lane: its log says the jobs class was paused at some point.
    log1 = (system.workdir / "s1.log").read_text()
    assert re.search(r"jobs lane: paused classes \['jobs'\]", log1)
    print(f"second scheduler had a jobs partition {handover_s:.1f} s after it started")
