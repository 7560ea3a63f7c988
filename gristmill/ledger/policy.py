"""The durability ledger's decisions, pure: what a message read from a request topic
is (reconciled, pending, overdue, missing), which ones to look up now, and what one
partition may count and store (decision 54). No Kafka, no database, the clock passed in.

The invariant checked: every message below the scheduler's committed offset has a
terminal row in the request log (the scheduler commits an offset only after the rows
below it are stored). A message above that offset without a row is pending, and
overdue once its deadline plus a grace has passed: the scheduler writes even a request
it could not run in time (``expired``), so an overdue one is work nobody is doing.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

from scheduler.core.intake import MAX_EPOCH_S

TP = tuple[str, int]
MINUTE_S = 60
# The ages (s) unreconciled messages are counted under, each bucket up to its bound.
AGE_BOUNDS: tuple[float, ...] = (1.0, 10.0, 60.0, 600.0, 3600.0, float("inf"))
# A pending message is looked up again after a quarter of its age, within these (s):
# young ones soon (most get their row within a batch time), old ones (a job backlog)
# rarely, so a million waiting items cost a lookup each every half minute at most.
RECHECK_MIN_S = 0.5
RECHECK_MAX_S = 30.0


class State(StrEnum):
    PENDING = "pending"  # no row yet, and the scheduler has not committed past it
    TERMINAL = "terminal"  # its request's row came from this message
    DUPLICATE = "duplicate"  # another message of the same request id holds the row
    MISSING = "missing"  # the scheduler committed past it and there is no row: lost
    UNREADABLE = "unreadable"  # names no request: the API never acknowledged it


SETTLED = frozenset({State.TERMINAL, State.DUPLICATE, State.MISSING, State.UNREADABLE})


@dataclass(frozen=True, slots=True)
class Entry:
    """One message of a request topic, as far as the ledger reads it."""

    offset: int
    request_id: str  # canonical UUID text; "" when unreadable
    tenant_id: str
    received_at: float  # epoch s: its period is the minute of this
    deadline: float  # epoch s
    appended_at: float  # epoch s: the broker's LogAppendTime

    @property
    def minute(self) -> int:
        return int(self.received_at // MINUTE_S) * MINUTE_S


def read_entry(raw: bytes | None, offset: int, appended_at: float) -> Entry:
    """The entry of a message's value. A message that names no valid request id and
    tenant is unreadable (the API writes none such; the scheduler dead-letters it with no
    row); times that are not times fall back to the broker's, as the scheduler's
    failed row does (scheduler/core/intake.py)."""
    try:
        data: Any = orjson.loads(raw or b"")
        request_id = str(uuid.UUID(str(data["request_id"])))
        tenant_id = str(uuid.UUID(str(data["tenant_id"])))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return Entry(offset, "", "", appended_at, appended_at, appended_at)
    received = _time(data.get("received_at"), appended_at)
    deadline = _time(data.get("deadline"), received)
    return Entry(offset, request_id, tenant_id, received, deadline, appended_at)


def _time(v: Any, default: float) -> float:
    ok = type(v) in (int, float) and 0 < v < MAX_EPOCH_S
    return float(v) if ok else default


@dataclass(frozen=True, slots=True)
class RowSeen:
    """A request's row in the log: which message it was written from (None: a row
    written without one, which then counts for any message of its request)."""

    position: tuple[str, int, int] | None


def judge(entry: Entry, tp: TP, row: RowSeen | None, committed: int | None) -> State:
    """What a message is, given its request's row (None: no row) and the scheduler's
    committed offset on its partition, read *before* the row was looked up (so a row
    stored before that commit is seen)."""
    if not entry.request_id:
        return State.UNREADABLE
    if row is not None:
        if row.position is None or row.position == (tp[0], tp[1], entry.offset):
            return State.TERMINAL
        return State.DUPLICATE
    if committed is not None and entry.offset < committed:
        return State.MISSING
    return State.PENDING


def overdue(entry: Entry, now: float, grace_s: float) -> bool:
    return now > entry.deadline + grace_s


def next_check(entry: Entry, now: float, grace_s: float) -> float:
    """When a pending message is looked up again: after a quarter of its age (bounded),
    and never later than the moment it would turn overdue, so an alert is never raised
    for a row that has landed."""
    wait = min(max((now - entry.appended_at) / 4, RECHECK_MIN_S), RECHECK_MAX_S)
    at = now + wait
    turns_overdue = entry.deadline + grace_s
    return min(at, turns_overdue) if turns_overdue > now else at


@dataclass(slots=True)
class Counts:
    accepted: int = 0  # terminal + missing: distinct requests acknowledged
    terminal: int = 0
    missing: int = 0
    duplicate: int = 0

    def add(self, state: State) -> None:
        if state is State.TERMINAL:
            self.accepted += 1
            self.terminal += 1
        elif state is State.MISSING:
            self.accepted += 1
            self.missing += 1
        elif state is State.DUPLICATE:
            self.duplicate += 1


Key = tuple[str, int]  # (tenant id, minute as epoch s)


@dataclass(slots=True)
class Settlement:
    """What one partition may store: the offset it now stands at (every message below
    it counted), the counts of the messages newly settled, the missing ones by name."""

    tp: TP
    old_offset: int
    new_offset: int
    counts: dict[Key, Counts]
    missing: list[Entry]
    outcomes: dict[State, int]
    taken: int = 0  # messages it takes off the book once stored


@dataclass(slots=True)
class _Slot:
    entry: Entry
    state: State = State.PENDING
    due_at: float = 0.0  # 0: never looked up


@dataclass
class PartitionBook:
    """One partition's messages from the stored offset on, in offset order. Messages
    settle in any order but are counted in order: the stored offset moves only over a
    settled prefix, so a restart re-reads exactly what was not counted (at-least-once
    reading, exactly-once counting; decision 54)."""

    tp: TP
    stored: int  # the offset the ledger's table holds for this partition
    position: int = 0  # the next offset to read (at least ``stored``)
    _slots: deque[_Slot] = field(default_factory=deque)
    _by_offset: dict[int, _Slot] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.position = max(self.position, self.stored)

    def __len__(self) -> int:
        return len(self._slots)

    def add(self, entry: Entry) -> None:
        """A message read. A redelivery below what is held (a seek back) is ignored."""
        if entry.offset < self.stored or entry.offset in self._by_offset:
            return
        if self._slots and entry.offset < self._slots[-1].entry.offset:
            return
        slot = _Slot(entry, State.UNREADABLE if not entry.request_id else State.PENDING)
        self._slots.append(slot)
        self._by_offset[entry.offset] = slot
        self.position = max(self.position, entry.offset + 1)

    def due(self, now: float, committed: int | None) -> list[Entry]:
        """Pending messages to look up now: never looked up, due again, or passed by the
        scheduler's commit since (they must have a row now)."""
        return [
            s.entry
            for s in self._slots
            if s.state is State.PENDING
            and (s.due_at <= now or (committed is not None and s.entry.offset < committed))
        ]

    def record(
        self,
        entry: Entry,
        row: RowSeen | None,
        committed: int | None,
        now: float,
        grace_s: float,
    ) -> State:
        slot = self._by_offset.get(entry.offset)
        if slot is None or slot.state is not State.PENDING:
            return State.PENDING if slot is None else slot.state
        slot.state = judge(entry, self.tp, row, committed)
        if slot.state is State.PENDING:
            slot.due_at = next_check(entry, now, grace_s)
        return slot.state

    def settle(self) -> Settlement | None:
        """What storing now would count: the settled prefix (left in place until
        ``stored_at`` says the store went through); None when nothing would move."""
        counts: dict[Key, Counts] = {}
        missing: list[Entry] = []
        outcomes: dict[State, int] = {}
        new, taken = self.stored, 0
        for slot in self._slots:
            if slot.state not in SETTLED:
                break
            e, st = slot.entry, slot.state
            outcomes[st] = outcomes.get(st, 0) + 1
            if st is not State.UNREADABLE:
                counts.setdefault((e.tenant_id, e.minute), Counts()).add(st)
            if st is State.MISSING:
                missing.append(e)
            new, taken = e.offset + 1, taken + 1
        if taken == len(self._slots) and self.position > new:
            new = self.position  # nothing held: past gaps (transaction markers) too
        if new == self.stored:
            return None
        return Settlement(self.tp, self.stored, new, counts, missing, outcomes, taken)

    def stored_at(self, s: Settlement) -> None:
        """The table now holds ``s``: its messages leave the book."""
        for _ in range(s.taken):
            slot = self._slots.popleft()
            del self._by_offset[slot.entry.offset]
        self.stored = s.new_offset

    def held(self) -> list[tuple[Entry, State]]:
        return [(s.entry, s.state) for s in self._slots]

    def unsettled_by_key(self, skip: int = 0) -> dict[Key, int]:
        """Messages read and not yet counted, by tenant and minute (an export's
        ``pending``), past the first ``skip`` (those being counted); unreadable ones name
        no tenant."""
        out: dict[Key, int] = {}
        for i, s in enumerate(self._slots):
            if i >= skip and s.entry.request_id:
                k = (s.entry.tenant_id, s.entry.minute)
                out[k] = out.get(k, 0) + 1
        return out

    def settled_through(self, skip: int, caught_up_at: float | None) -> float | None:
        """Every message appended before the returned time is counted once the first
        ``skip`` held are (append times grow along a partition): the next held message's
        append time, else the time the partition's end was seen (``caught_up_at``), else
        None (unknown: keep what is stored)."""
        if len(self._slots) > skip:
            return self._slots[skip].entry.appended_at
        return caught_up_at


@dataclass(frozen=True, slots=True)
class Unreconciled:
    """What the metrics show of the messages held: pending ones by age bucket (the
    bucket's upper bound in seconds), how many are overdue, the oldest one's age."""

    by_age: dict[float, int]
    overdue: int
    oldest_s: float


def unreconciled(books: Iterable[PartitionBook], now: float, grace_s: float) -> Unreconciled:
    by_age = dict.fromkeys(AGE_BOUNDS, 0)
    late, oldest = 0, 0.0
    for book in books:
        for e, st in book.held():
            if st is not State.PENDING:
                continue
            age = max(0.0, now - e.received_at)
            oldest = max(oldest, age)
            by_age[next(b for b in AGE_BOUNDS if age < b)] += 1
            late += overdue(e, now, grace_s)
    return Unreconciled(by_age, late, oldest)


def wants_pause(held: int, window: int, paused: bool) -> bool:
    """A partition whose book holds ``window`` messages stops being read until it is
    down to half (memory stays bounded behind a message that does not settle)."""
    return held > window // 2 if paused else held >= window


def merge_counts(settlements: Iterable[Settlement]) -> dict[Key, Counts]:
    out: dict[Key, Counts] = {}
    for s in settlements:
        for k, c in s.counts.items():
            t = out.setdefault(k, Counts())
            t.accepted += c.accepted
            t.terminal += c.terminal
            t.missing += c.missing
            t.duplicate += c.duplicate
    return out


def complete(settled_through: Mapping[TP, float | None], until: float, produce_s: float) -> bool:
    """Whether an export up to ``until`` (received time) is final: every partition has
    counted every message appended before ``until`` plus the longest a message may take
    from being received to being appended (the produce timeout)."""
    if not settled_through:
        return False
    return all(t is not None and t >= until + produce_s for t in settled_through.values())
