"""Group commit: a write takes on the like writes queued behind it, in one transaction;
if PostgreSQL refuses any row, each write is stored alone (no database needed: the
store is a plain function raising the driver's real exception types)."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from core.messages import RequestMessage
from core.vocab import RequestStatus
from scheduler.core.batcher import Batch, BatchKey, Pending
from scheduler.core.plans import Write
from scheduler.runtime import persister as persister_mod
from scheduler.runtime.persister import Persister
from scheduler.runtime.priority_pool import PriorityPool

KEY = BatchKey("sim", "1")


def _write(first: int, n: int, priority: int = 1, **kw: Any) -> Write:
    now = time.time()
    items = [
        Pending(
            RequestMessage(
                request_id=f"00000000-0000-0000-0000-{i:012d}",
                tenant_id="00000000-0000-0000-0000-00000000000a",
                priority="paid",
                model="sim",
                version="1",
                input=f"x{i}",
                params={},
                deadline=now + 5,
                received_at=now,
            ),
            KEY,
            priority,
            ("topic", 0),
            i,
            now,
        )
        for i in range(first, first + n)
    ]
    batch = Batch(KEY, items, formed_at=now, reason="full")
    return Write(
        priority,
        RequestStatus.SUCCEEDED,
        items,
        batch=batch,
        outputs=[{"i": p.offset} for p in items],
        compute=(now, now),
        worker_id="w",
        batch_row=True,
        **kw,
    )


class _Store:
    """Holds the first transaction until told, so the next writes queue behind it."""

    def __init__(self, refuse: str | None = None) -> None:
        self.calls: list[tuple[list[str], int]] = []
        self.release = threading.Event()
        self.refuse = refuse

    def __call__(self, rows: list[dict[str, Any]], brows: list[dict[str, Any]]) -> None:
        if not self.calls:
            self.release.wait(5)
        ids = [r["request_id"] for r in rows]
        self.calls.append((ids, len(brows)))
        if self.refuse is not None and self.refuse in ids:
            raise psycopg.errors.CharacterNotInRepertoire("invalid byte sequence")


def _run(store: _Store, writes: list[Write]) -> list[int]:
    done: list[int] = []
    lock = threading.Lock()

    def on_done(offsets: list[tuple[Any, int]], n: int) -> None:
        with lock:
            done.extend(o for _, o in offsets)

    p = Persister(store, _NoLetters(), on_done, threading.Event())
    p.pool.shutdown(wait=True)  # a pool of one thread: the order is the test's
    p.pool = PriorityPool(1, name="persist")
    try:
        p.submit(writes[:1])
        time.sleep(0.05)  # the first write is in the store, holding the thread
        p.submit(writes[1:])
        store.release.set()
    finally:
        p.shutdown()
    return sorted(done)


class _NoLetters:
    def send(self, letters: list[Any]) -> bool:
        return True


def test_writes_queued_behind_a_write_go_in_one_transaction() -> None:
    store = _Store()
    writes = [_write(0, 3), _write(3, 4), _write(7, 2), _write(9, 5)]
    assert _run(store, writes) == list(range(14))
    # The first alone (it was running), the three queued behind it together.
    assert [len(ids) for ids, _ in store.calls] == [3, 11]
    assert [b for _, b in store.calls] == [1, 3]  # each batch keeps its batch row


def test_a_merged_write_never_passes_the_row_budget_or_a_different_priority() -> None:
    store = _Store()
    budget = persister_mod.MERGE_ROWS
    writes = [_write(0, 1), _write(1, budget - 10), _write(budget, 20), _write(5000, 2, 3)]
    assert _run(store, writes) == sorted(p.offset for w in writes for p in w.items)
    # budget-10 rows fit, the next 20 would not; the lower priority goes on its own.
    assert [len(ids) for ids, _ in store.calls] == [1, budget - 10, 20, 2]


def test_a_refused_row_in_a_merged_write_sends_each_write_its_own_way() -> None:
    bad = "00000000-0000-0000-0000-000000000004"
    store = _Store(refuse=bad)
    writes = [_write(0, 2), _write(2, 3), _write(5, 3)]
    assert _run(store, writes) == list(range(8))
    sizes = [len(ids) for ids, _ in store.calls]
    assert sizes[:2] == [2, 6]  # the first, then the two queued ones merged: refused
    assert sizes[2] == 3  # the second write alone, refused again, then split...
    assert [bad] in [ids for ids, _ in store.calls[3:]]  # ...until the bad row is alone
    assert ([5, 6, 7], 1) in [
        ([int(i[-3:]) for i in ids], b) for ids, b in store.calls
    ]  # the third write stored whole, with its batch row


def test_dead_letter_writes_are_not_merged() -> None:
    store = _Store()
    writes = [_write(0, 2), _write(2, 2), _write(4, 2, dead_letter=True)]
    _run(store, writes)
    assert [len(ids) for ids, _ in store.calls][:2] == [2, 2]
