"""What the consumer lanes read, on its way in: decoded, handed to the engine that runs it.

Each lane's thread calls ``accept`` with what it fetched. A message the scheduler
cannot read becomes a ``Reject`` (scheduler/core/intake.py): its offset is held until
the persister has recorded it. Every other request goes to the engine whose model it
names (generation, else batching: scheduler/runtime/engines.py), which drops those of
partitions revoked since the fetch. A revocation goes to every engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from confluent_kafka import Message

from core.models.spec import ModelSpec
from scheduler.core.batcher import Pending
from scheduler.core.intake import decode
from scheduler.core.offsets import TopicPartition
from scheduler.core.plans import Reject
from scheduler.runtime import tracing
from scheduler.runtime.engines import RequestEngine
from scheduler.runtime.host import CoreHost

Specs = Mapping[str, Mapping[str, ModelSpec]]


class Feed:
    def __init__(
        self,
        host: CoreHost,
        engines: Sequence[RequestEngine],
        specs: Callable[[], Specs],
        record: Callable[[list[Reject]], None],
    ):
        """``engines``: asked in order which runs a model (the last takes the rest);
        ``specs``: every known version's spec, read per fetch (intake keys batches by
        their parameters); ``record``: the persister's queue for rejects."""
        self.host = host
        self.engines = list(engines)
        self.specs = specs
        self.record = record

    def accept(self, msgs: list[Message], owned: set[TopicPartition], now: float) -> None:
        """Queue fetched requests; unreadable ones are recorded and skipped."""
        specs = self.specs()
        routed: list[list[Pending]] = [[] for _ in self.engines]
        rejects: list[Reject] = []
        for msg in msgs:
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            assert topic is not None and partition is not None and offset is not None
            _, ts_ms = msg.timestamp()
            got = decode(
                msg.value(),
                tp=(topic, partition),
                offset=offset,
                produced_at=ts_ms / 1000.0 if ts_ms > 0 else None,
                now=now,
                specs=specs,
            )
            if isinstance(got, Pending):
                got.trace = tracing.context_of(msg)
                routed[self._engine_of(got.msg.model)].append(got)
            else:
                rejects.append(got)
        for engine, items in zip(self.engines, routed, strict=True):
            if items:
                engine.take(items, owned)
        if rejects and (kept := self.host.rejected(rejects, owned)):
            self.record(kept)

    def _engine_of(self, model: str) -> int:
        last = len(self.engines) - 1
        return next((i for i, e in enumerate(self.engines[:last]) if e.runs(model)), last)

    def give_up_partitions(self, tps: list[TopicPartition]) -> None:
        for engine in self.engines:
            engine.revoke(tps)
