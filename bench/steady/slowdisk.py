"""A slow moment of the database, made for real: every ``period_s`` PostgreSQL's disk
writes are throttled to ``iops`` a second for ``slow_s`` seconds (a noisy neighbour on
a shared volume, a cloud disk out of burst credit, a replica's storage catching up)
while a ``CHECKPOINT`` is forced, so the checkpoint's writes and fsyncs and every
commit's WAL flush queue at the device.

The throttle is the kernel's (cgroup v1 blkio ``throttle.write_iops_device``, which
holds back the writes a process submits, fdatasync's among them): the server's
processes are moved into a cgroup of their own (a backend it forks later inherits it)
and only that cgroup is throttled, so nothing else on the machine is slowed. Needs
root and the v1 blkio hierarchy; ``available()`` says whether this machine has it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

import psycopg

from bench.steady.watch import Sample, Sampler
from gristmill.devservices.procs import children

BLKIO = Path("/sys/fs/cgroup/blkio")


def available() -> bool:
    return os.geteuid() == 0 and (BLKIO / "blkio.throttle.write_iops_device").exists()


def device_of(path: Path) -> str:
    """``major:minor`` of the block device ``path`` lives on."""
    st = os.stat(path)
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


class SlowDisk(Sampler):
    """Each period: throttle, CHECKPOINT (on a connection of its own), unthrottle after
    ``slow_s``; records when, how long the checkpoint took and the throttle in force."""

    def __init__(
        self,
        dsn: str,
        postmaster: int,
        data_dir: Path,
        *,
        period_s: float,
        slow_s: float,
        iops: int,
    ):
        super().__init__(period_s, "slow-disk")
        self.dsn, self.slow_s, self.iops = dsn, slow_s, iops
        self.device = device_of(data_dir)
        self.group = BLKIO / f"gristmill-bench-{os.getpid()}"
        self.group.mkdir(exist_ok=True)
        for pid in (postmaster, *children(postmaster)):
            with contextlib.suppress(OSError):  # a backend that just exited
                (self.group / "cgroup.procs").write_text(str(pid))

    def _limit(self, iops: int) -> None:
        (self.group / "blkio.throttle.write_iops_device").write_text(f"{self.device} {iops}")

    def sample(self, t: float) -> Sample:
        done: dict[str, float] = {}

        def checkpoint() -> None:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=30) as conn:
                t0 = time.monotonic()
                conn.execute("CHECKPOINT")
                done["seconds"] = round(time.monotonic() - t0, 3)

        self._limit(self.iops)
        try:
            worker = threading.Thread(target=checkpoint, daemon=True)
            worker.start()
            time.sleep(self.slow_s)
        finally:
            self._limit(0)  # 0: no limit
        worker.join(60)
        return {"t": t, "slow_s": self.slow_s, "iops": self.iops, **done}

    def stop(self) -> None:
        super().stop()
        with contextlib.suppress(OSError):
            self._limit(0)

    def close(self) -> None:
        """Move whatever is left back to the root group and remove ours."""
        with contextlib.suppress(OSError):
            for pid in (self.group / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (BLKIO / "cgroup.procs").write_text(pid)
            self.group.rmdir()
