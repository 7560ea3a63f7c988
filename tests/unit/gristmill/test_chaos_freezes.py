"""gristmill/chaos/freezes.py and the fault plan with freezes (no services: a real child
process is frozen and thawed)."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from gristmill.chaos import faults, freezes
from gristmill.chaos.chart import pause_s, recovery_chart


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_frozen_process_is_stopped_for_the_pause_and_runs_after() -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        seen: list[str] = []

        def look() -> None:
            time.sleep(0.2)
            seen.append(_state(p.pid))

        t = threading.Thread(target=look)
        t.start()
        t0 = time.monotonic()
        freezes.freeze([p.pid], 0.5)
        assert time.monotonic() - t0 >= 0.5
        t.join()
        assert seen == ["T"]  # stopped while frozen
        assert _state(p.pid) in ("S", "R")  # running (asleep) again
    finally:
        p.kill()
        p.wait()


def test_every_kind_has_its_freeze_and_the_plan_stays_balanced() -> None:
    rig = SimpleNamespace(
        services=SimpleNamespace(kafka=SimpleNamespace(n_brokers=3), postgres=object()),
        schedulers=["sched-a", "sched-b"],
        apis=["api-a", "api-b"],
        nets={},
    )
    kinds = faults.available_kinds(rig)  # type: ignore[arg-type]
    assert set(freezes.FREEZE_KINDS) <= set(kinds)
    assert set(faults.KINDS) - set(kinds) == set(faults.CUTS)  # no namespaces: no cuts
    rig.nets = {"sched-b": object(), "api-b": object()}
    assert set(faults.KINDS) == set(faults.available_kinds(rig))  # type: ignore[arg-type]
    only_kills = faults.available_kinds(rig, freezes_too=False)  # type: ignore[arg-type]
    assert not set(only_kills) & set(freezes.FREEZE_KINDS)
    plan = faults.plan(50, kinds, random.Random(3))
    counts = {k: plan.count(k) for k in kinds}
    assert max(counts.values()) - min(counts.values()) <= 1


def test_pauses_are_short_or_past_the_consumer_session() -> None:
    rng = random.Random(1)
    seen = {freezes.pause_s(rng) for _ in range(50)}
    assert seen == {freezes.SHORT_S, freezes.LONG_S}
    assert freezes.LONG_S > 6.0  # scheduler/runtime/lane.py's session.timeout.ms


def test_the_recovery_chart_reads_a_freeze_pause(tmp_path: Path) -> None:
    assert pause_s("SIGSTOP 8 s, pids [12]") == 8.0
    assert pause_s("pid 12") == 0.0
    assert pause_s("cut from kafka+postgres 8 s") == 8.0
    out = tmp_path / "recovery.png"
    rows = [
        {"kind": "api", "partitions_s": 1.0, "apis_s": 3.0, "detail": "pid 1"},
        {"kind": "freeze-api", "partitions_s": 2.0, "apis_s": 9.0, "detail": "SIGSTOP 8 s"},
        {"kind": "worker", "partitions_s": None, "apis_s": 1.0, "detail": ""},
    ]
    assert recovery_chart(rows, out)
    assert out.stat().st_size > 1000
