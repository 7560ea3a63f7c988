"""ingest/admission/shared_slots.py: slots counted across an instance's processes (real processes,
a real directory, the kernel's record locks; no services)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

import pytest

from ingest.admission.shared_slots import SharedSlots


def test_slots_per_tenant_then_per_instance(tmp_path: Path) -> None:
    slots = SharedSlots(tmp_path, "uploads", total=3, per_key=2)
    assert slots.try_acquire("a") is None and slots.try_acquire("a") is None
    assert slots.try_acquire("a") == "tenant"
    assert slots.try_acquire("b") is None
    assert slots.try_acquire("c") == "instance"
    slots.release("a")
    assert slots.try_acquire("c") is None
    assert [slots.held_here(k) for k in "abc"] == [1, 1, 1]
    slots.release("zzz")  # nothing held: nothing happens


def test_a_tenant_may_have_a_bound_of_its_own(tmp_path: Path) -> None:
    slots = SharedSlots(tmp_path, "streams", total=100, per_key=1)
    assert [slots.try_acquire("big", per_key=3) for _ in range(4)] == [None, None, None, "tenant"]
    assert slots.try_acquire("small") is None and slots.try_acquire("small") == "tenant"


def test_any_tenant_id_is_a_safe_file_name(tmp_path: Path) -> None:
    slots = SharedSlots(tmp_path, "x", total=4, per_key=1)
    for key in ("../../etc/passwd", "_instance", "a" * 500, "\x00"):
        assert slots.try_acquire(key) is None
        slots.release(key)
    assert {p.parent for p in (tmp_path / "x").iterdir()} == {tmp_path / "x"}


def _hold(directory: str, key: str, n: int, total: int, conn: Connection) -> None:
    """Another process of the instance: take ``n`` slots, say how it went, then wait."""
    slots = SharedSlots(Path(directory), "uploads", total=total, per_key=2)
    conn.send([slots.try_acquire(key) for _ in range(n)])
    conn.recv()  # until told to let go (or killed)
    for _ in range(n):
        slots.release(key)
    conn.send("released")


Other = Callable[..., tuple[BaseProcess, Connection]]


@pytest.fixture
def other_process(tmp_path: Path) -> Iterator[Other]:
    ctx = mp.get_context("spawn")
    started: list[tuple[BaseProcess, Connection]] = []

    def start(key: str, n: int, total: int = 8) -> tuple[BaseProcess, Connection]:
        mine, theirs = ctx.Pipe()
        p = ctx.Process(target=_hold, args=(str(tmp_path), key, n, total, theirs), daemon=True)
        p.start()
        started.append((p, mine))
        return p, mine

    yield start
    for p, _ in started:
        if p.is_alive():
            p.kill()
        p.join(5)


def test_a_key_holds_its_slots_across_the_instances_processes(
    tmp_path: Path, other_process: Other
) -> None:
    here = SharedSlots(tmp_path, "uploads", total=8, per_key=2)
    _, conn = other_process("tenant-a", 2)
    assert conn.recv() == [None, None]
    assert here.try_acquire("tenant-a") == "tenant"  # 2 per key on the instance, not each
    assert here.try_acquire("tenant-b") is None  # another key is not held up
    conn.send("go")
    assert conn.recv() == "released"
    assert here.try_acquire("tenant-a") is None


def test_the_instance_total_spans_processes(tmp_path: Path, other_process: Other) -> None:
    here = SharedSlots(tmp_path, "uploads", total=3, per_key=2)
    _, c1 = other_process("t1", 2, total=3)
    assert c1.recv() == [None, None]
    assert here.try_acquire("t2") is None
    assert here.try_acquire("t3") == "instance"


def test_a_process_that_dies_leaks_no_slot(tmp_path: Path, other_process: Other) -> None:
    here = SharedSlots(tmp_path, "uploads", total=8, per_key=2)
    p, conn = other_process("tenant-a", 2)
    assert conn.recv() == [None, None]
    assert here.try_acquire("tenant-a") == "tenant"
    assert p.pid is not None
    os.kill(p.pid, signal.SIGKILL)
    p.join(5)
    assert here.try_acquire("tenant-a") is None and here.try_acquire("tenant-a") is None
