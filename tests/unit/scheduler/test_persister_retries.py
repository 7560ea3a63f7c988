"""The persister's retry loop: transient faults are retried, the rows' own faults are
not, and once stopping it gives up so Kafka redelivers (no database needed: the store
is a plain function raising the driver's real exception types)."""

from __future__ import annotations

import threading

import psycopg
import pytest
from sqlalchemy.exc import OperationalError

from scheduler.runtime import persister as persister_mod
from scheduler.runtime.deadletter import Letter
from scheduler.runtime.persister import Persister, _Refused


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(persister_mod, "RETRY_FIRST_S", 0.001)
    monkeypatch.setattr(persister_mod, "RETRY_MAX_S", 0.002)


class _Sink:
    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.sent: list[list[Letter]] = []

    def send(self, letters: list[Letter]) -> bool:
        self.sent.append(letters)
        if self.refusals:
            self.refusals -= 1
            return False
        return True


def _lost() -> OperationalError:
    return OperationalError("INSERT", {}, psycopg.OperationalError("connection lost"))


def _persister(store: object, sink: _Sink, stopping: threading.Event) -> Persister:
    return Persister(store, sink, lambda done, n: None, stopping)  # type: ignore[arg-type]


def test_a_transient_fault_is_retried_until_the_write_lands() -> None:
    calls: list[int] = []

    def store(rows: object, brow: object) -> None:
        calls.append(1)
        if len(calls) < 4:
            raise _lost()

    p = _persister(store, _Sink(0), threading.Event())
    try:
        assert p._store([], []) is True
        assert len(calls) == 4
    finally:
        p.shutdown()


def test_a_data_fault_is_not_retried_but_refused() -> None:
    calls: list[int] = []

    def store(rows: object, brow: object) -> None:
        calls.append(1)
        raise psycopg.errors.CharacterNotInRepertoire("invalid byte sequence")

    p = _persister(store, _Sink(0), threading.Event())
    try:
        with pytest.raises(_Refused):
            p._store([], [])
        assert len(calls) == 1
    finally:
        p.shutdown()


def test_once_stopping_a_failing_write_gives_up_for_kafka_to_redeliver() -> None:
    calls: list[int] = []

    def store(rows: object, brow: object) -> None:
        calls.append(1)
        raise _lost()

    stopping = threading.Event()
    stopping.set()
    p = _persister(store, _Sink(0), stopping)
    try:
        assert p._store([], []) is False
        assert len(calls) == persister_mod.STOPPING_TRIES
    finally:
        p.shutdown()


def test_dead_letters_are_sent_again_until_confirmed() -> None:
    sink = _Sink(refusals=2)
    p = _persister(lambda rows, brow: None, sink, threading.Event())
    try:
        assert p._letters([Letter(None, b"x", {})]) is True
        assert len(sink.sent) == 3
    finally:
        p.shutdown()


def test_unconfirmed_dead_letters_hold_the_write_once_stopping() -> None:
    stopping = threading.Event()
    stopping.set()
    sink = _Sink(refusals=100)
    p = _persister(lambda rows, brow: None, sink, stopping)
    try:
        assert p._letters([Letter(None, b"x", {})]) is False
        assert len(sink.sent) == persister_mod.STOPPING_TRIES
    finally:
        p.shutdown()
