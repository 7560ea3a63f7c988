"""The supervisor every long-lived scheduler thread starts through
(scheduler/runtime/supervisor.py): a thread's unexpected exception is logged once and
calls the process's stop once; a thread that returns just ends."""

from __future__ import annotations

import logging
import threading

import pytest

from scheduler.runtime.supervisor import Supervisor


def test_a_failing_thread_is_logged_once_and_stops_the_process(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stops: list[tuple[str, str]] = []
    sup = Supervisor(lambda name, exc: stops.append((name, str(exc))))

    def broken() -> None:
        raise RuntimeError("a bug in the lane")

    with caplog.at_level(logging.DEBUG, logger="scheduler.runtime.supervisor"):
        sup.start(broken, name="lane-sync").join(5)
    assert stops == [("lane-sync", "a bug in the lane")]
    assert sup.failure is not None and sup.failure[0] == "lane-sync"
    records = [r for r in caplog.records if r.exc_info]
    assert len(records) == 1 and "lane-sync" in records[0].getMessage()
    assert records[0].levelno == logging.CRITICAL


def test_later_failures_do_not_stop_again() -> None:
    stops: list[str] = []
    sup = Supervisor(lambda name, exc: stops.append(name))

    def fail(n: int) -> None:
        raise ValueError(n)

    sup.start(fail, 1, name="first").join(5)
    sup.start(fail, 2, name="second").join(5)
    assert stops == ["first"] and sup.failure is not None and sup.failure[0] == "first"


def test_a_thread_that_returns_is_not_a_failure() -> None:
    stops: list[str] = []
    sup = Supervisor(lambda name, exc: stops.append(name))
    got: list[int] = []
    t = sup.start(got.append, 7, name="worker")
    t.join(5)
    assert got == [7] and not t.is_alive() and t.daemon and t.name == "worker"
    assert stops == [] and sup.failure is None


def test_the_stop_can_be_given_after_the_threads_start() -> None:
    gate = threading.Event()
    sup = Supervisor()
    stopped = threading.Event()

    def later() -> None:
        gate.wait(5)
        raise RuntimeError("late")

    t = sup.start(later, name="late")
    sup.on_failure(lambda name, exc: stopped.set())
    gate.set()
    t.join(5)
    assert stopped.is_set()
