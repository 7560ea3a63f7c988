"""One Kafka consumer and the thread that drives it: a lane of the scheduler.

The scheduler reads each sync class and the job items through lanes of their own,
each with its own consumer, fetch queue and thread (decision 0011); job items in a
consumer group of their own. librdkafka keeps fetched messages in one FIFO per
consumer whatever their topic, so with a single consumer a sync request could sit
behind a prefetch of job items; in its own lane it is fetched and queued the moment
it lands.

A lane alone touches its Consumer: it polls, pauses and resumes its classes'
partitions, commits the offsets of its partitions and answers rebalances. What it
reads goes to its feed (scheduler/runtime/feed.py: decoded, handed to the engine that
runs it); which offsets it may commit and which classes to pause it asks the dispatch
core's host (scheduler/runtime/host.py). Its thread starts through the supervisor:
an exception it does not expect stops the process in order rather than leave the
partitions unread (decision 0047).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from core.config import Settings
from core.kafka import consumer_config
from core.topics import request_topic
from core.vocab import PRIORITY_CLASSES, PriorityClass
from scheduler.core.backpressure import LaneHold, lane_hold
from scheduler.core.intake import topic_class
from scheduler.runtime import metrics
from scheduler.runtime.supervisor import Supervisor

log = logging.getLogger(__name__)

TP = tuple[str, int]
# How often a held lane looks at its classes' buffers again (s): resuming costs at most
# this, against the half-budget of queued work the workers are still taking.
HOLD_RECHECK_S = 0.005


class LaneFeed(Protocol):
    """Where what a lane reads goes (scheduler/runtime/feed.py)."""

    def accept(self, msgs: list[Message], owned: set[TP], now: float) -> None: ...
    def give_up_partitions(self, tps: list[TP]) -> None: ...


class LaneBooks(Protocol):
    """The offsets and buffers a lane asks about (the core's host)."""

    def committable(self, only: set[TP]) -> dict[TP, int]: ...
    def mark_committed(self, positions: dict[TP, int]) -> None: ...
    def wanted_paused(self, paused: frozenset[int]) -> frozenset[int]: ...


@dataclass(frozen=True)
class LaneSpec:
    name: str
    group_id: str
    ranks: frozenset[int]  # the priority classes (ranks) this lane reads
    # librdkafka fetch settings: how much this lane may prefetch.
    fetch: dict[str, Any] = field(default_factory=dict)

    def topics(self, settings: Settings) -> list[str]:
        return [request_topic(settings, PRIORITY_CLASSES[r]) for r in sorted(self.ranks)]


# Short prefetch: a paused class must stop adding to the queue quickly, and an
# enterprise request never sits behind much fetched traffic. Refill at once when it
# drains: librdkafka otherwise backs a partition's fetches off for a second after the
# queue was full, which held a burst in Kafka at ~800 messages/s while the workers could
# take 2,000/s.
SYNC_FETCH: dict[str, Any] = {
    "queued.max.messages.kbytes": 256,
    "max.partition.fetch.bytes": 65536,
    "fetch.queue.backoff.ms": 5,
}


def lane_specs(settings: Settings) -> list[LaneSpec]:
    """A lane per sync class, all in one consumer group, and job items in their own.

    One consumer subscribed to every sync topic is balanced by partition count: the
    group's assignor may give one scheduler all of a class's partitions (seen on a GPU
    host: all six enterprise partitions on one of three schedulers, which then carried
    every enterprise request). A consumer per class subscribes to one topic, so the
    assignor spreads each topic's partitions evenly over the schedulers whatever order
    they join in; committed offsets stay under the same group."""
    jobs = PriorityClass.JOBS
    lanes = [
        LaneSpec(c.value, settings.consumer_group, frozenset({c.rank}), SYNC_FETCH)
        for c in PRIORITY_CLASSES
        if c is not jobs
    ]
    lanes.append(
        LaneSpec(
            "jobs",
            f"{settings.consumer_group}-jobs",
            frozenset({jobs.rank}),
            # A deep backlog is read in large fetches; nothing waits behind it here.
            {
                "queued.max.messages.kbytes": 4096,
                "max.partition.fetch.bytes": 1 << 20,
                "fetch.queue.backoff.ms": 50,
            },
        )
    )
    return lanes


class ConsumerLane:
    def __init__(
        self,
        settings: Settings,
        spec: LaneSpec,
        feed: LaneFeed,
        books: LaneBooks,
        member: str = "",
    ):
        """``member``: the scheduler process's id, named in the consumer's client id."""
        self.settings, self.spec, self.feed, self.books = settings, spec, feed, books
        self.topics = spec.topics(settings)
        self.owned: set[TP] = set()
        self.hold = LaneHold()  # classes paused in Kafka; whether the lane is held
        self.lag: dict[str, int] = {}
        self.closing = threading.Event()  # set once the scheduler persisted all it will
        self.closed = False  # the consumer committed its last offsets and left the group
        # monotonic: when the asynchronous commit awaiting its answer left (0: none)
        self._commit_started = 0.0
        self.consumer = Consumer(
            consumer_config(
                settings,
                spec.group_id,
                **{
                    # Names the scheduler process in the group's description (tools,
                    # the balance test) beside the lane.
                    "client.id": f"gristmill-scheduler-{spec.name}"
                    + (f"-{member}" if member else ""),
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "partition.assignment.strategy": "cooperative-sticky",
                    # A dead member is noticed within the session timeout; see
                    # docs/decisions/0006-session-timeout-and-rebalances.md.
                    "session.timeout.ms": 6000,
                    "heartbeat.interval.ms": 1000,
                    # The broker answers a fetch as soon as any message lands
                    # (fetch.min.bytes=1), so a long wait costs no latency; a short one
                    # only spins the broker.
                    "fetch.wait.max.ms": 100,
                    "enable.partition.eof": False,
                    # The periodic commit does not wait for the broker (the lane keeps
                    # reading); its outcome arrives here, on this lane's thread.
                    "on_commit": self._on_commit,
                    **spec.fetch,
                },
            )
        )
        self.thread: threading.Thread | None = None

    # ---- lifecycle -----------------------------------------------------------------
    def start(self, stopping: threading.Event, supervisor: Supervisor) -> None:
        self._stopping = stopping
        self.consumer.subscribe(
            self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        self.thread = supervisor.start(self._run, name=f"lane-{self.spec.name}")

    def finish(self, timeout_s: float = 30.0) -> None:
        """Final commit and leave the group (the scheduler has persisted what it will)."""
        self.closing.set()
        if self.thread is not None:
            self.thread.join(timeout_s)
            if not self.thread.is_alive() and not self.closed:
                # The lane's thread failed (the supervisor is stopping the process): its
                # consumer is ours now; hand the partitions over as the lane would have.
                self._close()

    @property
    def paused(self) -> frozenset[int]:
        """Classes this lane is not reading now (paused, or held with the whole lane)."""
        return self.spec.ranks if self.hold.held_since is not None else self.hold.paused

    def _run(self) -> None:
        last_commit = last_lag = 0.0
        while not self._stopping.is_set():
            if self._apply_backpressure(time.time()):
                # Held: take nothing and look again shortly (backpressure.HOLD_MAX_S).
                self._stopping.wait(HOLD_RECHECK_S)
            else:
                # consume() waits for its whole timeout unless the count is reached,
                # which would add that wait to every request: block on poll() for the
                # first message only, then drain whatever is fetched without waiting.
                first = self.consumer.poll(0.05)
                msgs = [] if first is None else [first, *self.consumer.consume(499, timeout=0)]
                good = [m for m in msgs if _ok(m)]
                if good:
                    self.feed.accept(good, self.owned, time.time())
            now = time.time()
            if now - last_lag >= 1.0:
                self._measure_lag()
                last_lag = now
            if now - last_commit >= self.settings.commit_interval_ms / 1000:
                self.commit(wait=False)
                last_commit = now
        # Stopped consuming: wait for the scheduler to finish and persist, then hand over.
        self.closing.wait()
        self._close()

    def _close(self) -> None:
        self.commit()
        self.consumer.close()
        self.closed = True

    # ---- offsets -------------------------------------------------------------------
    def commit(self, only: set[TP] | None = None, *, wait: bool = True) -> None:
        """Commit the persisted positions of this lane's partitions (``only`` some).

        ``wait=False`` is the periodic commit: it returns at once and ``_on_commit``
        records the outcome when the broker answers. A commit that blocked the lane took
        a broker round trip every 100 ms out of its reading, longer whenever the
        broker's disk was slow. A revocation and the final commit wait: the partitions
        are handed over right after."""
        positions = self.books.committable(self.owned if only is None else only & self.owned)
        if not positions:
            return
        offsets = [TopicPartition(t, p, o) for (t, p), o in positions.items()]
        if not wait:
            self._commit_started = time.monotonic()
            try:
                self.consumer.commit(offsets=offsets, asynchronous=True)
            except Exception as exc:  # e.g. no assignment during a rebalance
                metrics.committed(self.spec.name, 0.0, ok=False)
                log.warning("%s lane: commit failed: %s", self.spec.name, exc)
            return
        started = time.monotonic()
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except Exception as exc:  # e.g. rebalance in progress; the next round retries
            metrics.committed(self.spec.name, time.monotonic() - started, ok=False)
            log.warning("%s lane: commit failed: %s", self.spec.name, exc)
            return
        metrics.committed(self.spec.name, time.monotonic() - started, ok=True)
        self.books.mark_committed(positions)

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """A commit's outcome (inside poll, on this lane's thread)."""
        took = time.monotonic() - self._commit_started
        counted = self._commit_started > 0  # an asynchronous one (not yet counted)
        self._commit_started = 0.0
        if err is not None:
            if counted:
                metrics.committed(self.spec.name, took, ok=False)
            if err.code() != KafkaError._NO_OFFSET:  # nothing to commit: not a failure
                log.warning("%s lane: commit failed: %s", self.spec.name, err)
            return
        done = {(p.topic, p.partition): p.offset for p in partitions if p.error is None}
        if counted:
            metrics.committed(self.spec.name, took, ok=len(done) == len(partitions))
        self.books.mark_committed(done)

    def _measure_lag(self) -> None:
        """Messages in Kafka not yet consumed, per class."""
        lag: dict[str, int] = {}
        try:
            for tp in self.consumer.position(self.consumer.assignment()):
                _, hi = self.consumer.get_watermark_offsets(tp, cached=True)
                if tp.offset >= 0 and hi >= 0:
                    cls_ = topic_class(tp.topic)
                    lag[cls_] = lag.get(cls_, 0) + max(0, hi - tp.offset)
        except Exception as exc:  # during a rebalance; next second retries
            log.debug("lag measurement failed: %s", exc)
            return
        self.lag = lag

    # ---- backpressure --------------------------------------------------------------
    def _class_partitions(
        self, ranks: frozenset[int], among: list[TopicPartition] | None = None
    ) -> list[TopicPartition]:
        topics = {request_topic(self.settings, PRIORITY_CLASSES[r]) for r in ranks}
        among = self.consumer.assignment() if among is None else among
        return [tp for tp in among if tp.topic in topics]

    def _apply_backpressure(self, now: float) -> bool:
        """Pause this lane's classes whose buffer is full, resume drained ones, or hold
        the whole lane (scheduler/core/backpressure.py); True while it takes no messages."""
        wanted = self.books.wanted_paused(self.paused) & self.spec.ranks
        before = self.hold
        self.hold = lane_hold(wanted, self.spec.ranks, before, now)
        if self.hold.paused != before.paused:
            if self.hold.paused - before.paused:
                self.consumer.pause(self._class_partitions(self.hold.paused - before.paused))
            if before.paused - self.hold.paused:
                self.consumer.resume(self._class_partitions(before.paused - self.hold.paused))
            log.info(
                "%s lane: paused classes %s",
                self.spec.name,
                [str(PRIORITY_CLASSES[r]) for r in sorted(self.hold.paused)],
            )
        return self.hold.held_since is not None

    # ---- rebalances (called inside poll, on this lane's thread) ----------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info(
            "%s lane: assigned %s", self.spec.name, [(p.topic, p.partition) for p in partitions]
        )
        self.owned.update((p.topic, p.partition) for p in partitions)
        if self.hold.paused:
            # Newly assigned partitions of a paused class start paused too.
            consumer.incremental_assign(partitions)
            consumer.pause(self._class_partitions(self.hold.paused, partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = [(p.topic, p.partition) for p in partitions]
        log.info("%s lane: revoked %s", self.spec.name, tps)
        self.commit(only=set(tps))
        self._give_up(tps)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = [(p.topic, p.partition) for p in partitions]
        log.warning("%s lane: lost %s", self.spec.name, tps)
        self._give_up(tps)

    def _give_up(self, tps: list[TP]) -> None:
        self.owned -= set(tps)
        self.feed.give_up_partitions(tps)


def _ok(msg: Message) -> bool:
    err = msg.error()
    if err is None:
        return True
    if err.code() != KafkaError._PARTITION_EOF:
        log.warning("consume error: %s", err)
    return False


def held_lag(lanes: list[ConsumerLane]) -> dict[str, int]:
    """Messages held back in Kafka because their class is paused, per class.

    Lag of a class that is being read is only in transit: the lane reads far
    faster than workers compute, so it shows up as queued work within moments
    (attributed to its tenants). Lag of a paused class waits for the workers."""
    out: dict[str, int] = {}
    for lane in lanes:
        paused = {PRIORITY_CLASSES[r] for r in lane.paused}
        out.update({c: n for c, n in lane.lag.items() if c in paused})
    return out
