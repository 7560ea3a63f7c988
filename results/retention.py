"""Which time partitions the log tables need and which have outlived retention. Pure.

The request log (``requests``) and its two companions (``answer_timeouts``,
``refusals``) are partitioned by range of a timestamp into slots of a fixed width
(``interval``), aligned to the Unix epoch in UTC so every instance names the same slot
the same way. Slots are made ``ahead`` of time, so a row never arrives before its
partition exists, and a partition is dropped whole once all of it is older than the
longest retention anyone asked for: retention costs no DELETE and leaves no dead rows
for vacuum. A tenant that asked for a shorter retention has its older rows deleted in
small batches by the sweeper (results/sweeper.py).
See docs/decisions/0029-compact-results-and-a-partitioned-request-log.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# The tables partitioned by time, each with its partition key.
PARTITIONED: dict[str, str] = {
    "requests": "received_at",
    "answer_timeouts": "received_at",
    "refusals": "at",
}


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition: rows with ``lower <= key < upper``; ``lower`` None is MINVALUE
    (the table that held the log before it was partitioned)."""

    table: str
    name: str
    lower: datetime | None
    upper: datetime


@dataclass(frozen=True, slots=True)
class Slot:
    """A partition to create."""

    table: str
    name: str
    lower: datetime
    upper: datetime


@dataclass(frozen=True, slots=True)
class Layout:
    """How partitions are cut: ``interval`` wide, made up to ``ahead`` past now."""

    interval: timedelta
    ahead: timedelta

    def __post_init__(self) -> None:
        if self.interval < timedelta(hours=1) or self.interval % timedelta(hours=1):
            raise ValueError("the partition interval must be a whole number of hours")
        if self.ahead < self.interval:
            raise ValueError("partitions must be made at least one interval ahead")


def slot_start(t: datetime, interval: timedelta) -> datetime:
    """The start of the slot holding ``t`` (slots are aligned to the epoch, UTC)."""
    n = math.floor((t - EPOCH) / interval)
    return EPOCH + n * interval


def partition_name(table: str, lower: datetime, interval: timedelta) -> str:
    """``requests_p20261126`` for a daily slot, ``requests_p2026112613`` for a shorter one."""
    fmt = "%Y%m%d" if interval % timedelta(days=1) == timedelta(0) else "%Y%m%d%H"
    return f"{table}_p{lower.astimezone(UTC).strftime(fmt)}"


def _uncovered(
    lo: datetime, hi: datetime, existing: list[Partition]
) -> list[tuple[datetime, datetime]]:
    """Parts of [lo, hi) no existing partition covers (partitions never overlap)."""
    gaps = [(lo, hi)]
    for p in existing:
        p_lo = p.lower or datetime.min.replace(tzinfo=UTC)
        nxt = []
        for a, b in gaps:
            if p.upper <= a or p_lo >= b:
                nxt.append((a, b))
                continue
            if a < p_lo:
                nxt.append((a, p_lo))
            if p.upper < b:
                nxt.append((p.upper, b))
        gaps = nxt
    return gaps


def to_create(table: str, now: datetime, existing: list[Partition], layout: Layout) -> list[Slot]:
    """The partitions ``table`` lacks from the slot holding ``now`` to ``ahead`` past it.
    A slot partly covered (the old table's range, or slots of an earlier interval) gets
    a partition for the part left, so ranges never overlap and none is missed."""
    mine = [p for p in existing if p.table == table]
    first = slot_start(now, layout.interval)
    # Slots missed while nothing made them (every process down longer than ``ahead``):
    # from the newest partition that ends before now, so no gap is left behind.
    ended = [p.upper for p in mine if p.upper <= first]
    if ended:
        first = slot_start(max(ended), layout.interval)
    last = slot_start(now + layout.ahead, layout.interval) + layout.interval
    out: list[Slot] = []
    start = first
    while start < last:
        end = start + layout.interval
        for a, b in _uncovered(start, end, mine):
            out.append(Slot(table, partition_name(table, a, layout.interval), a, b))
        start = end
    return out


def to_drop(now: datetime, existing: list[Partition], keep: timedelta) -> list[Partition]:
    """Partitions wholly older than ``keep`` (every row's key before ``now - keep``)."""
    horizon = now - keep
    return [p for p in existing if p.upper <= horizon]


def keep_for(default_days: int, tenant_days: list[int]) -> timedelta:
    """How long partitions live: the longest retention of the default and any tenant's
    own (a tenant's shorter retention is met by deleting its rows early, a longer one
    only by keeping the partitions)."""
    return timedelta(days=max([default_days, *tenant_days]))


@dataclass(frozen=True, slots=True)
class RowCutoffs:
    """Rows to delete one by one, because their partitions outlive them: each listed
    tenant's rows before its time, and (``others``, when a tenant keeps longer than the
    default) the rows of every tenant on the default (not in ``explicit``) before the
    default's."""

    tenants: dict[str, datetime]
    others: datetime | None
    explicit: frozenset[str]  # tenants with a retention of their own


def row_cutoffs(now: datetime, default_days: int, tenant_days: dict[str, int]) -> RowCutoffs:
    """What retention leaves to row deletion. Cheapest when the default is the longest
    retention: then only the tenants that asked for less are deleted row by row."""
    keep = keep_for(default_days, list(tenant_days.values()))
    default = timedelta(days=default_days)
    return RowCutoffs(
        tenants={
            t: now - timedelta(days=d) for t, d in tenant_days.items() if timedelta(days=d) < keep
        },
        others=now - default if default < keep else None,
        explicit=frozenset(tenant_days),
    )
