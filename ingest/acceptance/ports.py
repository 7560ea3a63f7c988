"""What the acceptance pipeline asks of Kafka and PostgreSQL, as protocols.

The API runs on the real ones (``AsyncProducer``, ``ResultWaiter``, ``KeyClaims``,
``JobPublisher``); unit tests drive every front door through the whole pipeline on
in-memory stand-ins (tests/unit/ingest/stubs.py, as Dramatiq's StubBroker serves its
tests), and the e2e suite on a real broker and database. Nothing on a user's path runs
on a stand-in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from core.kafka import KafkaHeaders
from results.generation import Progress
from results.requests import AnswerRow


class RequestProducer(Protocol):
    """Puts an accepted request's message in Kafka."""

    async def produce(
        self, topic: str, value: bytes, headers: KafkaHeaders | None = None
    ) -> tuple[int, int]:
        """(partition, offset) once the broker has it with acks=all; raises
        ``Unavailable`` (503) when it cannot."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Token:
    """A streamed token's text, by its output index."""

    index: int
    text: str


@dataclass(frozen=True, slots=True)
class End:
    """A stream's end: the request's final row (its text holds every token's), and the
    first index the stream had not sent (the row's to give from there)."""

    row: AnswerRow
    next_index: int


class TokenStream(Protocol):
    """One caller's view of a generating request: its tokens from the index it asked
    for, in order, then its end; one source, so never an end before a token."""

    async def next(self, timeout_s: float) -> Token | End | None:
        """The next token or the end; None when nothing came within ``timeout_s``."""
        ...

    def close(self) -> None: ...


class Waiter(Protocol):
    """The way back: answers heard as they are stored, finished rows fetched, streams."""

    listening: asyncio.Event  # set while results can reach this instance
    channel: str  # where this process hears its requests' answers (a message's reply_to)

    def register(
        self, request_id: str, received_at: float | None = None
    ) -> asyncio.Future[AnswerRow]:
        """Before producing, so a fast result cannot slip past; raises ``Unavailable``
        (503) while no result could reach this instance. ``received_at``: its message's
        time (epoch s), which narrows the fetch of its row."""
        ...

    def discard(self, request_id: str) -> None: ...

    async def fetch(self, ids: list[str]) -> list[AnswerRow]:
        """The finished rows among ``ids`` (a retry of requests that may be done)."""
        ...

    async def progress(self, request_id: str, tenant_id: str) -> Progress:
        """Whether the tenant's generation request is generating, or its final row."""
        ...

    def follow(self, request_id: str, tenant_id: str, next_index: int) -> TokenStream:
        """The tenant's generation request's tokens from ``next_index`` on, then its end."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True)
class Claim:
    first: bool  # this call is the first with the key (or the key had expired)
    request_id: str  # the request the key names: the one to send, fetch or wait for
    first_deadline: datetime | None = None  # when the first attempt's caller gave up
    # When the first attempt was received: a resend carries it, so the request keeps
    # one row (the request log's key includes received_at). None: an old claim.
    first_received: datetime | None = None
    # The version the first attempt was routed to (None: an old claim): a retry sent
    # again goes there (decision 44).
    version: str | None = None


@dataclass(frozen=True)
class KeyUse:
    """One request's use of an Idempotency-Key: the request id it would name, the body's
    fingerprint (what the caller sent: the model as it named it, its input and
    parameters), its deadline and arrival (epoch s), and the version routing picked."""

    tenant_id: str
    key: str
    request_id: str
    body_hash: str
    deadline: float
    received: float
    model_version: str = ""
    # The fingerprint claims made before decision 44 recorded (with the routed version),
    # worked out only when an old claim is met, so a retry of one is still recognised.
    legacy_hash: Callable[[], str] | None = field(default=None, compare=False)


class IdempotencyKeys(Protocol):
    """Idempotency-Key claims (after the IETF httpapi Idempotency-Key draft)."""

    async def claim(self, use: KeyUse) -> Claim:
        """Claim the key for ``use.request_id``; a retry gets the first request's.
        Raises ``IdempotencyConflict`` (422) when the key was used with another body."""
        ...

    async def release(self, use: KeyUse) -> None:
        """The claimed request never reached Kafka: free the key for the retry."""
        ...


class Pacing(Protocol):
    """How a job's intake gives way to the instance's sync requests
    (ingest/jobs/pacing.py)."""

    def after(self, slice_s: float) -> float:
        """The pause (s) after a slice of work that took ``slice_s``."""
        ...


class StagedItems(Protocol):
    """A new job's staged items (ingest/jobs/upload.py ``Staged``)."""

    @property
    def reused(self) -> frozenset[int]:
        """Indexes of the items an incremental job's base lends a result (decision 61)."""
        ...

    def pages(
        self, page_bytes: int, only: frozenset[int] | None = None
    ) -> Iterator[Sequence[tuple[int, bytes | str, str, int]]]:
        """(item_index, input as JSON, request_id, attempt) in input order, paged: the
        items not ``reused``, or those of ``only``."""
        ...


class JobQueue(Protocol):
    """Puts a recorded job's items in Kafka (phase 2 of a submission, decision 10)."""

    @property
    def pacer(self) -> Pacing | None:
        """How the intake gives way (None: it never pauses)."""
        ...

    async def publish(self, job_id: str, staged: StagedItems | None = None) -> int:
        """``staged``: a new job's staged file, read instead of its rows."""
        ...

    async def claim_stale(self) -> str | None:
        """A submission another instance left half done, now this one's to finish."""
        ...

    def close(self) -> None: ...
