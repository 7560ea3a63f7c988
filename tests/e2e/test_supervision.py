"""A scheduler thread that dies of a bug stops its process in order (decision 0047).

The paid class's lane of a real scheduler process (real Kafka, PostgreSQL, worker)
raises on the first request it reads. The supervisor logs it once and stops the scheduler: it
drains, leaves its consumer groups and exits with status 1, so an orchestrator starts
it again, never running on alive and idle with its partitions unread. The request it
was reading was never committed: the scheduler that takes over answers it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, Text, cast, func, select

from core.models.sim import sim_output
from gristmill.devservices.stack import REPO, Services, System, build_system, scheduler_command
from results.db import make_engine
from results.registry_schema import model_readiness
from results.schema import requests
from tests.e2e.broken_lane import BUG, LANE


@pytest.fixture(scope="module")
def stack(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    workdir: Path = tmp_path_factory.mktemp("supervision")
    system = build_system(services, workdir)
    try:
        system.url = system.start_api()
        yield system
    finally:
        system.close()


def _start_broken(system: System, name: str) -> Path:
    """``gristmill scheduler`` with the bug in its paid lane (tests/e2e/broken_lane.py)."""
    run_dir = Path(system.workdir / f"run-{name}")
    cmd = [sys.executable, "-m", "tests.e2e.broken_lane", *scheduler_command(1, "sim", run_dir)[4:]]
    log = system.workdir / f"{name}.log"
    system.procs[name] = subprocess.Popen(
        cmd,
        env=system.env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        cwd=REPO,
        start_new_session=True,
    )
    system._hold(name, f"scheduler {name} and its workers")
    return log


def _wait_ready(engine: Engine, timeout_s: float = 120) -> None:
    q = select(func.coalesce(func.sum(model_readiness.c.ready_workers), 0)).where(
        model_readiness.c.name == "sim"
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            if conn.execute(q).scalar_one() > 0:
                return
        time.sleep(0.5)
    raise AssertionError("the broken scheduler's worker never got ready")


def test_a_broken_lane_stops_the_scheduler_in_order_and_loses_nothing(stack: System) -> None:
    engine = make_engine(stack.settings.database_url, pool_size=1)
    log = _start_broken(stack, "broken")
    _wait_ready(engine)
    text = f"supervised {uuid.uuid4()}"
    answer: list[httpx.Response] = []

    def call() -> None:
        """The caller waits (two minutes at most) through the restart for its answer;
        503 only until the API has seen the worker ready (the request is not accepted)."""
        while True:
            r = httpx.post(
                f"{stack.url}/v1/infer",
                headers=stack.headers("paid"),
                json={"model": "sim", "input": text, "timeout_ms": 120_000},
                timeout=150,
            )
            if r.status_code != 503:
                answer.append(r)
                return
            time.sleep(0.2)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    # The paid lane reads that request and breaks: the supervisor stops the process.
    proc = stack.procs["broken"]
    code = proc.wait(timeout=90)  # drain (nothing queued), finish, leave the groups
    stack.stop("broken")
    out = log.read_text()
    assert code == 1, out[-3000:]
    assert out.count("Traceback") == 1 and out.count(BUG) == 1, out[-3000:]
    assert f"thread {LANE} failed; stopping the process" in out
    assert f"scheduler stopping (thread {LANE} failed)" in out
    assert "scheduler stopped:" in out

    # The orchestrator starts a scheduler again: the request, never committed, is read
    # again and answered, once.
    stack.start_scheduler("again", workers=1, models="sim")
    caller.join(150)
    assert answer and answer[0].status_code == 200, answer and answer[0].text
    assert answer[0].json()["output"] == sim_output(text)
    stored = cast(requests.c.input, Text) == json.dumps(text)  # input is JSONB
    with engine.connect() as conn:
        rows = conn.execute(select(requests.c.status).where(stored)).all()
    assert [row.status for row in rows] == ["succeeded"], rows
