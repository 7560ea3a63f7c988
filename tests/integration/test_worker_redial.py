"""A worker started with ``--redial`` (as ``gristmill host`` starts it) keeps serving the
other schedulers when one goes away, even with a batch of the lost one's in flight, and
joins that scheduler again once something listens on its socket (decision 51).

The two schedulers here are the worker protocol's own endpoints (core/protocol.py over
``multiprocessing.connection``), as the scheduler's worker pool opens them."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection, Listener
from pathlib import Path

import pytest

from core.config import load_settings
from core.models.registry import builtin_records
from core.models.sim import sim_output
from core.protocol import Hello, LoadModel, ModelStatus, WorkBatch, WorkResult


class Endpoint:
    """One scheduler's worker socket: listens, writes its key beside it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        key = secrets.token_bytes(32)
        (path.parent / "worker.key").write_bytes(key)
        self.listener = Listener(str(path), family="AF_UNIX", authkey=key)
        self.conn: Connection | None = None

    def accept(self) -> Hello:
        self.conn = self.listener.accept()
        hello = self.conn.recv()
        assert isinstance(hello, Hello)
        return hello

    def load(self) -> None:
        """Ask for sim, as a scheduler's model control does, and wait until it is ready."""
        assert self.conn is not None
        sim = next(r for r in builtin_records(load_settings()) if r.name == "sim")
        self.conn.send(LoadModel(sim))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = self.conn.recv()
            if isinstance(msg, ModelStatus) and msg.state == "ready":
                return
        raise AssertionError("sim did not load")

    def run(self, texts: list[str], wait: bool = True) -> WorkResult | None:
        assert self.conn is not None
        batch = WorkBatch(secrets.token_hex(4), "sim", "1", {}, texts)
        self.conn.send(batch)
        if not wait:
            return None
        while True:
            assert self.conn.poll(20), "no result: the worker stopped serving this scheduler"
            msg = self.conn.recv()
            if isinstance(msg, WorkResult):
                assert msg.batch_id == batch.batch_id
                return msg

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.listener.close()


@pytest.fixture
def worker_and_two() -> Iterator[tuple[subprocess.Popen[bytes], Endpoint, Endpoint]]:
    a_dir, b_dir = (Path(tempfile.mkdtemp(prefix="gm-redial-")) for _ in range(2))
    a, b = Endpoint(a_dir / "w.sock"), Endpoint(b_dir / "w.sock")
    env = {**os.environ, "GRISTMILL_SIM_BATCH_MS": "300", "GRISTMILL_SIM_MAX_BATCH": "8"}
    env.pop("GRISTMILL_WORKER_AUTHKEY", None)  # each key is read beside its socket
    worker = subprocess.Popen(
        [sys.executable, "-m", "gristmill", "worker", "--models", "sim", "--redial",
         "--socket", str(a.path), "--socket", str(b.path)],
        env=env,
    )  # fmt: skip
    try:
        a.accept()  # the worker dials every socket before it reads any of them
        b.accept()
        # b first: the ready it waits for is its own load's. a's ask is then answered
        # from what is loaded; a ready broadcast for b's load may reach a before that.
        b.load()
        a.load()
        yield worker, a, b
    finally:
        worker.terminate()
        worker.wait(20)
        a.close()
        b.close()


def test_a_lost_scheduler_is_dialled_again_and_the_other_keeps_its_results(
    worker_and_two: tuple[subprocess.Popen[bytes], Endpoint, Endpoint],
) -> None:
    worker, a, b = worker_and_two
    a.run(["a0", "a1"], wait=False)  # in flight when its scheduler dies
    a.close()
    texts = ["b0", "b1", "b2"]
    got = b.run(texts)
    assert got is not None and list(got.outputs or []) == [sim_output(t) for t in texts]
    assert worker.poll() is None, "the worker outlived its scheduler"
    # The scheduler comes back on the same path with a new key: the worker joins it.
    again = Endpoint(a.path)
    try:
        hello = again.accept()
        assert hello.pid == worker.pid
        again.load()
        res = again.run(["a2"])
        assert res is not None and list(res.outputs or []) == [sim_output("a2")]
        got = b.run(["b3"])
        assert got is not None and list(got.outputs or []) == [sim_output("b3")]
    finally:
        again.close()
