"""One worker process serving two scheduler processes' dispatch paths (decision 0014):
each scheduler gets its own results, the device runs one batch at a time across both,
and the worker outlives one scheduler but not the last."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from core.models.sim import sim_output
from tests.integration.test_dispatch_pipeline import _Svc


@pytest.fixture
def two() -> Iterator[tuple[_Svc, _Svc, subprocess.Popen[bytes]]]:
    a, b = (_Svc(20.0, n_workers=1, spawn=False) for _ in range(2))
    a.pool.start()
    b.pool.start()
    env = {
        **os.environ,
        "GRISTMILL_SIM_BATCH_MS": "20",
        "GRISTMILL_SIM_MAX_BATCH": "8",
    }
    env.pop("GRISTMILL_WORKER_AUTHKEY", None)  # each key is read beside its socket
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workers",
            "--socket",
            str(a.pool.socket_path),
            "--socket",
            str(b.pool.socket_path),
            "--models",
            "sim",
            "--worker-id",
            "shared",
        ],
        env=env,
    )
    try:
        assert a.ready.wait(60) and b.ready.wait(60), "the shared worker did not join both"
        yield a, b, worker
    finally:
        for s in (a, b):
            s.close()
        worker.wait(20)


def test_each_scheduler_gets_its_own_results_one_batch_at_a_time(
    two: tuple[_Svc, _Svc, subprocess.Popen[bytes]],
) -> None:
    a, b, worker = two
    assert a.handles[0].hello.pid == b.handles[0].hello.pid == worker.pid
    a.add([f"a{i}" for i in range(80)])
    b.add([f"b{i}" for i in range(80)])
    a.wait_rows(80)
    b.wait_rows(80)
    for svc, prefix in ((a, "a"), (b, "b")):
        by_id = {r["request_id"]: r for r in svc.rows}
        assert len(by_id) == 80
        for i in range(80):
            assert by_id[f"r{i}"]["output"] == sim_output(f"{prefix}{i}")
    # One device: the batches of both schedulers never computed at the same time.
    spans = sorted((r["compute_start_at"], r["compute_end_at"]) for r in a.batches + b.batches)
    assert len(spans) >= 20
    assert all(prev[1] <= nxt[0] for prev, nxt in itertools.pairwise(spans))


def test_the_worker_outlives_one_scheduler_but_not_the_last(
    two: tuple[_Svc, _Svc, subprocess.Popen[bytes]],
) -> None:
    a, b, worker = two
    a.close()
    b.add([f"b{i}" for i in range(24)])
    b.wait_rows(24)
    assert worker.poll() is None
    b.close()
    deadline = time.time() + 15
    while worker.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert worker.returncode == 0
