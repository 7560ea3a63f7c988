"""The durability ledger's loop: a consumer group of its own reads the request topics,
looks each message's row up by key, and stores its counts with its position in one
transaction (decision 54). What anything means is decided in policy.py.

Read-only towards the system: it never commits the scheduler's offsets, never writes
the request log, and its own group (``<consumer group>.ledger``) is one more reader of
the topics. Kafka's committed offsets of that group are only for lag tools: the position
it counts from is the one in ``ledger_partitions``, stored with the counts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec
from sqlalchemy.exc import SQLAlchemyError

from core.config import Settings
from core.kafka import admin_config, consumer_config
from core.topics import all_request_topics
from gristmill.ledger import metrics
from gristmill.ledger.policy import (
    TP,
    Entry,
    PartitionBook,
    RowSeen,
    Settlement,
    State,
    merge_counts,
    read_entry,
    unreconciled,
    wants_pause,
)
from results import ledger as sql
from results.db import make_engine
from scheduler.runtime.lane import lane_specs

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 0.5  # how often due messages are looked up
LOOKUP_CHUNK = 5_000  # request ids in one lookup
# Rows are looked up from this long before the earliest received time asked about: the
# row of a message whose received time was unreadable carries the broker's time.
LOOKUP_SLACK_S = 60.0


def ledger_group(settings: Settings) -> str:
    return f"{settings.consumer_group}.ledger"


def scheduler_groups(settings: Settings) -> dict[str, str]:
    """Each request topic's scheduler consumer group (the jobs lane has its own)."""
    return {t: spec.group_id for spec in lane_specs(settings) for t in spec.topics(settings)}


class Reconciler:
    def __init__(self, settings: Settings, *, group: str | None = None):
        self.settings = settings
        self.group = group or ledger_group(settings)
        self.grace_s = settings.ledger_grace_s
        self.engine = make_engine(settings.database_url, pool_size=2)
        self.admin = AdminClient(admin_config(settings))
        self.sched_groups = scheduler_groups(settings)
        self.consumer = Consumer(
            consumer_config(
                settings,
                self.group,
                **{
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "client.id": f"gristmill-ledger-{self.group}",
                },
            )
        )
        self.books: dict[TP, PartitionBook] = {}
        self.paused: set[TP] = set()

    # --- assignment ---

    def _assigned(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        tps = [(p.topic, p.partition) for p in parts]
        lows = self._offsets(tps, OffsetSpec.earliest(), timeout_s=10)
        for tp in tps:
            if tp not in lows:  # the batch failed for it: ask once more, or fail the assignment
                lows[tp] = consumer.get_watermark_offsets(TopicPartition(*tp), timeout=10)[0]
            lows[tp] = max(0, lows[tp])
        with self.engine.begin() as conn:
            stored = sql.start_offsets(conn, self.group, lows)
        for p in parts:
            tp = (p.topic, p.partition)
            book = PartitionBook(tp, stored[tp], position=lows[tp])
            self.books[tp] = book
            p.offset = book.position
        consumer.assign(parts)
        log.info("ledger reads %d partitions", len(parts))

    def _revoked(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        # The next owner re-reads from the stored position; what was not stored is lost
        # to this instance only, never counted twice.
        for p in parts:
            self.books.pop((p.topic, p.partition), None)
            self.paused.discard((p.topic, p.partition))
        consumer.unassign()

    # --- the loop ---

    def run(self, stop: threading.Event) -> None:
        self.consumer.subscribe(
            all_request_topics(self.settings), on_assign=self._assigned, on_revoke=self._revoked
        )
        next_check = next_store = 0.0
        try:
            while not stop.is_set():
                self._read(self.consumer.consume(num_messages=1000, timeout=0.2))
                now = time.time()
                if now >= next_check:
                    self._check(now)
                    next_check = now + CHECK_INTERVAL_S
                if now >= next_store:
                    self._store(time.time())
                    next_store = now + self.settings.ledger_store_interval_s
                self._pace()
            self._check(time.time())
            self._store(time.time())
        finally:
            self.consumer.close()
            self.engine.dispose()

    def _read(self, msgs: Sequence[Message]) -> None:
        now = time.time()
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("ledger read error: %s", err)
                continue
            topic, part, off = m.topic(), m.partition(), m.offset()
            if topic is None or part is None or off is None:
                continue
            book = self.books.get((topic, part))
            if book is None:
                continue
            _kind, ms = m.timestamp()
            book.add(read_entry(m.value(), off, ms / 1000 if ms > 0 else now))

    def scheduler_committed(self) -> dict[TP, int | None]:
        """The scheduler's committed offset on each partition this instance reads."""
        from confluent_kafka import ConsumerGroupTopicPartitions

        by_group: dict[str, list[TopicPartition]] = {}
        for t, p in self.books:
            by_group.setdefault(self.sched_groups.get(t, ""), []).append(TopicPartition(t, p))
        out: dict[TP, int | None] = {}
        for group, tps in by_group.items():
            if not group:
                continue
            futs = self.admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group, tps)], request_timeout=10
            )
            for fut in futs.values():
                for tp in fut.result().topic_partitions or []:
                    out[(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else None
        return out

    def _check(self, now: float) -> None:
        """Look up what is due. The scheduler's offsets are read first: a row stored
        before a commit the ledger saw is then seen too (decision 54)."""
        if not self.books:
            return
        try:
            committed = self.scheduler_committed()
        except KafkaException as exc:
            log.warning("ledger cannot read the scheduler's offsets: %s", exc)
            return
        due: list[tuple[PartitionBook, Entry]] = []
        for tp, book in self.books.items():
            due += [(book, e) for e in book.due(now, committed.get(tp))]
        if not due:
            return
        ids = sorted({e.request_id for _, e in due})
        since = min(min(e.received_at, e.appended_at) for _, e in due) - LOOKUP_SLACK_S
        try:
            rows: dict[str, sql.Position] = {}
            with self.engine.connect() as conn:
                for i in range(0, len(ids), LOOKUP_CHUNK):
                    rows.update(sql.rows_for(conn, ids[i : i + LOOKUP_CHUNK], since))
        except SQLAlchemyError as exc:
            log.warning("ledger cannot read the request log: %s", exc)
            return
        for book, entry in due:
            row = RowSeen(rows[entry.request_id]) if entry.request_id in rows else None
            book.record(entry, row, committed.get(book.tp), now, self.grace_s)

    def _offsets(self, tps: list[TP], spec: OffsetSpec, timeout_s: float) -> dict[TP, int]:
        """Each partition's first or next offset, in one request per broker. Not the
        consumer's own lookup: that queues behind its fetch long-poll, half a second a
        partition, which made a store (and so a stop) take seconds per partition."""
        if not tps:
            return {}
        futs = self.admin.list_offsets(
            {TopicPartition(*tp): spec for tp in tps},
            isolation_level=IsolationLevel.READ_COMMITTED,  # as far as the consumer reads
            request_timeout=timeout_s,
        )
        out: dict[TP, int] = {}
        for tp, fut in futs.items():
            try:
                out[(tp.topic, tp.partition)] = fut.result().offset
            except KafkaException as exc:  # unknown for now
                log.debug("ledger offsets of %s[%d]: %s", tp.topic, tp.partition, exc)
        return out

    def _store(self, now: float) -> None:
        plans: list[tuple[PartitionBook, Settlement | None]] = []
        steps: list[sql.Step] = []
        pending: dict[TP, dict[tuple[str, int], int]] = {}
        lag = 0
        settled_books = [(tp, book, book.settle()) for tp, book in self.books.items()]
        # Where everything read is settled, the ledger may be caught up: ask for the
        # end, taking the time before asking so that nothing later is counted.
        whole = [tp for tp, book, s in settled_books if (s.taken if s else 0) == len(book)]
        asked_at = time.time()
        ends = self._offsets(whole, OffsetSpec.latest(), timeout_s=5)
        for tp, book, s in settled_books:
            taken = s.taken if s else 0
            caught_up, high = None, ends.get(tp, -1)
            if tp in ends:
                if book.position >= high >= 0:
                    caught_up = asked_at
            elif tp not in whole:
                try:  # the end the last fetch saw: enough for the lag gauge
                    _low, high = self.consumer.get_watermark_offsets(
                        TopicPartition(*tp), cached=True
                    )
                except KafkaException as exc:  # unknown for now: the stored time stays
                    log.debug("ledger watermark of %s: %s", tp, exc)
            lag += max(0, high - book.position) if high >= 0 else 0
            new = s.new_offset if s else book.stored
            steps.append(sql.Step(tp, book.stored, new, book.settled_through(taken, caught_up)))
            pending[tp] = book.unsettled_by_key(skip=taken)
            plans.append((book, s))
        metrics.show(unreconciled(self.books.values(), now, self.grace_s), lag)
        settled = [s for _, s in plans if s is not None]
        counts = {
            k: (c.accepted, c.terminal, c.missing, c.duplicate)
            for k, c in merge_counts(settled).items()
        }
        missing = [
            sql.Missing(s.tp, e.offset, e.request_id, e.tenant_id, e.received_at)
            for s in settled
            for e in s.missing
        ]
        try:
            sql.store(self.engine, self.group, steps, counts, pending, missing)
        except sql.LostPartition as e:
            log.warning("%s; reading them again from the stored position", e)
            self._reload(e.tps)
            return
        except SQLAlchemyError as e:
            log.warning("ledger cannot store (will retry): %s", e)
            return
        for m in missing:
            log.error(
                "LOST: request %s of tenant %s (%s[%d]@%d) has no terminal row below the "
                "scheduler's committed offset",
                m.request_id,
                m.tenant_id,
                m.tp[0],
                m.tp[1],
                m.offset,
            )
        outcomes: dict[State, int] = {}
        commits: list[TopicPartition] = []
        for book, s in plans:
            if s is None:
                continue
            book.stored_at(s)
            for st, n in s.outcomes.items():
                outcomes[st] = outcomes.get(st, 0) + n
            commits.append(TopicPartition(book.tp[0], book.tp[1], s.new_offset))
        metrics.counted(outcomes, now)
        if commits:
            try:  # for lag tools only; the stored position is the ledger's own
                self.consumer.commit(offsets=commits, asynchronous=True)
            except KafkaException as e:
                log.debug("ledger offset commit: %s", e)

    def _reload(self, tps: list[TP]) -> None:
        with self.engine.begin() as conn:
            stored = sql.start_offsets(conn, self.group, {tp: 0 for tp in tps})
        for tp in tps:
            if tp not in self.books:
                continue
            book = PartitionBook(tp, stored[tp])
            self.books[tp] = book
            self.consumer.seek(TopicPartition(tp[0], tp[1], book.position))

    def _pace(self) -> None:
        """Bounded memory: a partition holding its window waits in Kafka."""
        window = self.settings.ledger_window
        for tp, book in self.books.items():
            was = tp in self.paused
            now_paused = wants_pause(len(book), window, was)
            if now_paused != was:
                (self.consumer.pause if now_paused else self.consumer.resume)([TopicPartition(*tp)])
                (self.paused.add if now_paused else self.paused.discard)(tp)
