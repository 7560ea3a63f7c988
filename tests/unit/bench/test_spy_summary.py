"""py-spy's raw samples summarized for the GPU host's reports (bench/gpuhost/measure.py):
whole-process tables, and per thread role when recorded with ``--threads``, checked on
hand-written lines and on a real recording of a process with a busy and an idle thread."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bench.gpuhost.measure import SPY_MODES, summarize_spy, thread_group

LINES = [
    "thread (11): MainThread;main (/src/w.py:1);launch (/src/w.py:9) 30",
    "thread (12): read-0;run (/t/t.py:1);reader (/src/w.py:20);poll (/src/c.py:5) 50",
    "thread (13): read-1;run (/t/t.py:1);reader (/src/w.py:20);recv (/src/c.py:7) 10",
    "thread (14): finish;Thread.run (/src/threading.py:1);finisher (/src/w.py:30) 10",
    "not a sample line",
]


def test_thread_roles_drop_their_numbers_only() -> None:
    assert thread_group("read-3") == "read"
    assert thread_group("ThreadPoolExecutor-0_1") == "ThreadPoolExecutor-0_1"
    assert thread_group("MainThread") == "MainThread"
    assert thread_group("dispatch-gpu0") == "dispatch-gpu0"


def test_per_thread_shares_add_up_and_each_role_has_its_own_frames() -> None:
    got = summarize_spy(LINES, by_thread=True)
    assert got["samples"] == 100
    threads = got["threads"]
    assert list(threads) == ["read", "MainThread", "finish"]  # most samples first
    assert threads["read"]["share"] == 0.6 and threads["read"]["samples"] == 60
    assert dict(threads["read"]["own"]) == {"poll c.py:5)": 0.833, "recv c.py:7)": 0.167}
    assert dict(threads["MainThread"]["inclusive"])["main w.py:1)"] == 1.0


def test_without_threads_it_is_one_table_and_empty_for_nothing() -> None:
    plain = [line.partition(";")[2] for line in LINES[:4]]
    got = summarize_spy(plain)
    assert got["samples"] == 100
    assert dict(got["own"])["poll c.py:5)"] == 0.5
    assert summarize_spy(["junk"]) == {}
    assert set(SPY_MODES) == {"cpu", "gil", "threads"}


def test_a_real_recording_names_a_busy_and_an_idle_thread(tmp_path: Path) -> None:
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        pytest.skip("py-spy is not installed")
    script = tmp_path / "two.py"
    script.write_text(
        textwrap.dedent(
            """
            import threading, time
            def spin():
                while True:
                    sum(range(1000))
            def nap():
                while True:
                    time.sleep(0.01)
            threading.Thread(target=spin, name="spin-0", daemon=True).start()
            threading.Thread(target=nap, name="nap-0", daemon=True).start()
            time.sleep(30)
            """
        )
    )
    proc = subprocess.Popen([sys.executable, str(script)])
    raw = tmp_path / "raw.txt"
    try:
        time.sleep(0.5)
        rec = subprocess.run(
            [spy, "record", "--pid", str(proc.pid), "--duration", "1", "--rate", "100",
             "--format", "raw", "--nonblocking", "--output", str(raw), *SPY_MODES["threads"]],
            capture_output=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        proc.kill()
        proc.wait()
    if rec.returncode != 0 or not raw.exists():
        pytest.skip(f"py-spy cannot sample here: {rec.stderr.decode(errors='replace')[:200]}")
    threads = summarize_spy(raw.read_text().splitlines(), by_thread=True)["threads"]
    assert {"spin", "nap", "MainThread"} <= set(threads)
    assert any("spin" in f for f, _ in threads["spin"]["own"])
