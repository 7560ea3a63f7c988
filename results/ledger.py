"""The durability ledger's SQL (gristmill/ledger/, decision 54): the request log's rows
looked up by key, the ledger's own position, counts and export.

No query here scans the request log: rows are found by request id (the key's first
column) within the received times of what is looked up, so PostgreSQL probes the
primary-key index of the request log's partitions from there on only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, Engine, and_, any_, bindparam, delete, func, select, update
from sqlalchemy.dialects.postgresql import ARRAY, UUID, insert

from results.schema import (
    ledger_counts,
    ledger_missing,
    ledger_partitions,
    ledger_pending,
    requests,
)

TP = tuple[str, int]
_UUIDS = ARRAY(UUID(as_uuid=False))
Position = tuple[str, int, int] | None  # (topic, partition, offset) a row was written from


class LostPartition(Exception):
    """Another ledger instance moved a partition on since this one read its offset."""

    def __init__(self, tps: list[TP]):
        super().__init__(f"ledger partitions moved on elsewhere: {tps}")
        self.tps = tps


def _dt(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(epoch_s, UTC)


def rows_for(conn: Connection, ids: Sequence[str], since: float) -> dict[str, Position]:
    """The rows of ``ids`` received at ``since`` or later: where each was written from."""
    if not ids:
        return {}
    q = select(
        requests.c.request_id,
        requests.c.kafka_topic,
        requests.c.kafka_partition,
        requests.c.kafka_offset,
    ).where(
        requests.c.request_id == any_(bindparam("ids", list(ids), type_=_UUIDS)),
        requests.c.received_at >= _dt(since),
    )
    out: dict[str, Position] = {}
    for rid, topic, part, off in conn.execute(q):
        out[str(rid)] = None if topic is None or part is None or off is None else (topic, part, off)
    return out


def start_offsets(conn: Connection, group: str, lows: Mapping[TP, int]) -> dict[TP, int]:
    """Where the ledger stands on each partition; a partition seen for the first time
    starts at ``lows`` (the oldest message Kafka still holds) and is recorded there."""
    if lows:
        conn.execute(
            insert(ledger_partitions)
            .values(
                [
                    {"consumer_group": group, "topic": t, "partition": p, "next_offset": o}
                    for (t, p), o in sorted(lows.items())
                ]
            )
            .on_conflict_do_nothing()
        )
    q = select(
        ledger_partitions.c.topic, ledger_partitions.c.partition, ledger_partitions.c.next_offset
    ).where(ledger_partitions.c.consumer_group == group)
    return {(t, p): o for t, p, o in conn.execute(q) if (t, p) in lows}


@dataclass(frozen=True, slots=True)
class Step:
    """One partition's move in a store: from the offset read to the new one."""

    tp: TP
    old_offset: int
    new_offset: int
    settled_through: float | None


@dataclass(frozen=True, slots=True)
class Missing:
    tp: TP
    offset: int
    request_id: str
    tenant_id: str
    received_at: float


CountRow = tuple[int, int, int, int]  # accepted, terminal, missing, duplicate


def store(
    engine: Engine,
    group: str,
    steps: Sequence[Step],
    counts: Mapping[tuple[str, int], CountRow],
    pending: Mapping[TP, Mapping[tuple[str, int], int]],
    missing: Iterable[Missing],
) -> None:
    """One transaction: every partition's move (each only from the offset this instance
    read: LostPartition when one moved on elsewhere, and nothing is stored), the counts
    added, the partitions' pending replaced, the missing named."""
    with engine.begin() as conn:
        lost: list[TP] = []
        for s in steps:
            values: dict[str, object] = {"next_offset": s.new_offset, "updated_at": func.now()}
            if s.settled_through is not None:
                values["settled_through"] = _dt(s.settled_through)
            r = conn.execute(
                update(ledger_partitions)
                .where(
                    ledger_partitions.c.consumer_group == group,
                    ledger_partitions.c.topic == s.tp[0],
                    ledger_partitions.c.partition == s.tp[1],
                    ledger_partitions.c.next_offset == s.old_offset,
                )
                .values(values)
            )
            if r.rowcount != 1:
                lost.append(s.tp)
        if lost:
            raise LostPartition(lost)
        if counts:
            # Sorted: two instances adding to the same rows lock them in one order.
            rows = [
                {
                    "consumer_group": group,
                    "tenant_id": tenant,
                    "minute": _dt(minute),
                    "accepted": c[0],
                    "terminal": c[1],
                    "missing": c[2],
                    "duplicate": c[3],
                }
                for (tenant, minute), c in sorted(counts.items())
            ]
            ins = insert(ledger_counts).values(rows)
            ex = ins.excluded
            conn.execute(
                ins.on_conflict_do_update(
                    index_elements=["consumer_group", "tenant_id", "minute"],
                    set_={
                        "accepted": ledger_counts.c.accepted + ex.accepted,
                        "terminal": ledger_counts.c.terminal + ex.terminal,
                        "missing": ledger_counts.c.missing + ex.missing,
                        "duplicate": ledger_counts.c.duplicate + ex.duplicate,
                    },
                )
            )
        for (topic, part), by_key in sorted(pending.items()):
            conn.execute(
                delete(ledger_pending).where(
                    ledger_pending.c.consumer_group == group,
                    ledger_pending.c.topic == topic,
                    ledger_pending.c.partition == part,
                )
            )
            if by_key:
                conn.execute(
                    insert(ledger_pending).values(
                        [
                            {
                                "consumer_group": group,
                                "topic": topic,
                                "partition": part,
                                "tenant_id": tenant,
                                "minute": _dt(minute),
                                "pending": n,
                            }
                            for (tenant, minute), n in sorted(by_key.items())
                        ]
                    )
                )
        named = [
            {
                "consumer_group": group,
                "topic": m.tp[0],
                "partition": m.tp[1],
                "kafka_offset": m.offset,
                "request_id": m.request_id,
                "tenant_id": m.tenant_id,
                "received_at": _dt(m.received_at),
            }
            for m in missing
        ]
        if named:
            conn.execute(insert(ledger_missing).values(named).on_conflict_do_nothing())


@dataclass(frozen=True, slots=True)
class Export:
    accepted: int
    terminal: int
    missing: int
    pending: int
    duplicate: int
    settled_through: dict[TP, float | None]
    missing_ids: list[str]


def export(
    conn: Connection, group: str, tenant_id: str, since: datetime, until: datetime
) -> Export:
    """A tenant's counts for the minutes that start in [since, until). ``accepted``
    includes what the ledger read and has not counted yet (``pending``)."""
    c = ledger_counts.c
    in_period = and_(
        c.consumer_group == group, c.tenant_id == tenant_id, c.minute >= since, c.minute < until
    )
    acc, term, miss, dup = conn.execute(
        select(
            func.coalesce(func.sum(c.accepted), 0),
            func.coalesce(func.sum(c.terminal), 0),
            func.coalesce(func.sum(c.missing), 0),
            func.coalesce(func.sum(c.duplicate), 0),
        ).where(in_period)
    ).one()
    p = ledger_pending.c
    pend = conn.execute(
        select(func.coalesce(func.sum(p.pending), 0)).where(
            p.consumer_group == group,
            p.tenant_id == tenant_id,
            p.minute >= since,
            p.minute < until,
        )
    ).scalar_one()
    lp = ledger_partitions.c
    through = {
        (t, part): (None if at is None else at.timestamp())
        for t, part, at in conn.execute(
            select(lp.topic, lp.partition, lp.settled_through).where(lp.consumer_group == group)
        )
    }
    m = ledger_missing.c
    ids = [
        str(r)
        for r in conn.execute(
            select(m.request_id)
            .where(
                m.consumer_group == group,
                m.tenant_id == tenant_id,
                m.received_at >= since,
                m.received_at < until,
            )
            .order_by(m.received_at)
            .limit(100)
        ).scalars()
    ]
    return Export(int(acc) + int(pend), int(term), int(miss), int(pend), int(dup), through, ids)
