"""The runtime's shape rules that review alone would not keep (decision 0047): only
the host takes the dispatch core's lock, and every thread starts through the
supervisor."""

from __future__ import annotations

import re
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[3] / "scheduler" / "runtime"


def _sources(skip: str) -> dict[str, str]:
    return {
        str(p.relative_to(RUNTIME)): p.read_text() for p in RUNTIME.rglob("*.py") if p.name != skip
    }


def test_only_the_host_takes_the_cores_lock() -> None:
    takes = re.compile(r"with [\w.]*cond\b|\bcond\.(wait|notify)")
    found = {name for name, text in _sources("host.py").items() if takes.search(text)}
    assert found == set(), f"the core's lock is taken outside host.py: {found}"


def test_every_thread_starts_through_the_supervisor() -> None:
    found = {
        name for name, text in _sources("supervisor.py").items() if "threading.Thread(" in text
    }
    assert found == set(), f"threads started outside the supervisor: {found}"
