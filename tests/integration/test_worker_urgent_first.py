"""A worker serving several schedulers launches the most urgent batch it holds first:
a sync batch sent after other schedulers' job batches runs before them, while each
scheduler's own batches keep their order (workers/ready.py, decision 76)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.protocol import WorkBatch, WorkResult
from tests.integration.test_worker_redial import Endpoint

JOB_DEADLINE_S = 24 * 3600.0  # a job's completion window
SYNC_DEADLINE_S = 5.0


@pytest.fixture
def worker_and_three() -> Iterator[list[Endpoint]]:
    ends = [Endpoint(Path(tempfile.mkdtemp(prefix="gm-urgent-")) / "w.sock") for _ in range(3)]
    env = {**os.environ, "GRISTMILL_SIM_BATCH_MS": "250", "GRISTMILL_SIM_MAX_BATCH": "8"}
    env.pop("GRISTMILL_WORKER_AUTHKEY", None)  # each key is read beside its socket
    args = [sys.executable, "-m", "gristmill", "worker", "--models", "sim"]
    for e in ends:
        args += ["--socket", str(e.path)]
    worker = subprocess.Popen(args, env=env)
    try:
        for e in ends:
            e.accept()  # the worker dials every socket before it reads any of them
        for e in reversed(ends):
            e.load()
        yield ends
    finally:
        worker.terminate()
        worker.wait(20)
        for e in ends:
            e.close()


def send(end: Endpoint, name: str, deadline_in_s: float) -> str:
    assert end.conn is not None
    batch = WorkBatch(
        f"{name}-{secrets.token_hex(3)}",
        "sim",
        "1",
        {},
        [name],
        deadline=time.time() + deadline_in_s,
    )
    end.conn.send(batch)
    return batch.batch_id


def results(end: Endpoint, n: int) -> list[WorkResult]:
    got: list[WorkResult] = []
    assert end.conn is not None
    while len(got) < n:
        assert end.conn.poll(30), "no result from the worker"
        msg = end.conn.recv()
        if isinstance(msg, WorkResult):
            assert msg.error is None, msg.error
            got.append(msg)
    return got


def test_a_sync_batch_runs_before_job_batches_that_came_first(
    worker_and_three: list[Endpoint],
) -> None:
    a, b, c = worker_and_three
    send(a, "a0", JOB_DEADLINE_S)  # the device is busy with this one meanwhile
    time.sleep(0.1)
    b_ids = [send(b, "b0", JOB_DEADLINE_S), send(b, "b1", JOB_DEADLINE_S)]
    time.sleep(0.05)
    c_id = send(c, "c0", SYNC_DEADLINE_S)
    (sync,) = results(c, 1)
    jobs = results(b, 2)
    assert sync.batch_id == c_id
    assert [r.batch_id for r in jobs] == b_ids  # b's batches in the order b sent them
    assert sync.compute_start < min(r.compute_start for r in jobs)
    results(a, 1)


def test_a_scheduler_s_job_batch_goes_first_on_behalf_of_its_sync_batch(
    worker_and_three: list[Endpoint],
) -> None:
    a, b, c = worker_and_three
    send(a, "a0", JOB_DEADLINE_S)
    time.sleep(0.1)
    send(b, "b0", JOB_DEADLINE_S)
    own = send(c, "c-job", JOB_DEADLINE_S)
    time.sleep(0.05)
    urgent = send(c, "c-sync", SYNC_DEADLINE_S)  # behind c's own job batch
    first, second = results(c, 2)
    (other,) = results(b, 1)
    assert (first.batch_id, second.batch_id) == (own, urgent)
    assert second.compute_start < other.compute_start
    results(a, 1)
