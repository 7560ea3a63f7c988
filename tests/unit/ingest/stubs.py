"""In-memory stand-ins for what the acceptance pipeline asks of Kafka and PostgreSQL
(ingest/acceptance/ports.py), for unit tests only: the way Dramatiq's StubBroker serves
its tests. ``stub_app`` builds the whole API (gate, fast path, FastAPI, every front
door) around them, so a request runs admit, claim, produce, wait and answer in
milliseconds. The e2e suite runs the same paths on a real broker and database.

``Worker`` plays the scheduler and the workers: it answers what was produced, the way
the result store would (a row per request, announced to the waiter).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine
from starlette.types import ASGIApp

from core.config import Settings
from core.errors import IdempotencyConflict, Unavailable
from core.kafka import KafkaHeaders
from core.messages import RequestMessage
from core.models.registry import builtin_records
from core.models.sim import sim_output
from core.models.token_ids import input_text
from core.vocab import RequestStatus
from ingest.acceptance.catalog import ModelCatalog
from ingest.acceptance.ports import Claim, End, KeyUse, StagedItems, Token
from ingest.acceptance.routing import RouteTable, Served
from ingest.acceptance.state import AppState
from ingest.admission.load_watch import LoadWatch
from ingest.admission.overload import Overload
from ingest.admission.ratelimit import InflightLimiter, TenantLimiter
from ingest.admission.shared_slots import InstanceSlots
from ingest.app import create_asgi
from ingest.edge.auth import Authenticator
from ingest.edge.db_health import DatabaseHealth
from ingest.edge.readiness import Readiness
from ingest.services import Services
from results.generation import Progress
from results.requests import AnswerRow
from results.tenants import Tenant, hash_key, new_key
from results.vectors import from_floats


class StubProducer:
    """Kafka that takes every message at once (or refuses all: ``down``)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, RequestMessage]] = []
        self.down = False
        self.on_produce: Callable[[RequestMessage], None] | None = None

    async def produce(
        self, topic: str, value: bytes, headers: KafkaHeaders | None = None
    ) -> tuple[int, int]:
        if self.down:
            why = "could not make the request durable in Kafka (stub)"
            raise Unavailable(why, retry_after_s=2, reason="kafka")
        msg = RequestMessage.decode(value)  # what the scheduler would read
        self.sent.append((topic, msg))
        if self.on_produce is not None:
            self.on_produce(msg)
        return 0, len(self.sent) - 1

    def close(self) -> None:
        pass


class StubStream:
    """A ``TokenStream`` over the stub waiter's tokens and rows."""

    def __init__(self, waiter: StubWaiter, request_id: str, next_index: int):
        self.waiter = waiter
        self.request_id = request_id
        self.next_index = next_index
        self.closed = False

    async def next(self, timeout_s: float) -> Token | End | None:
        deadline = time.monotonic() + timeout_s
        async with self.waiter.changed:
            while True:
                tokens = self.waiter.tokens.get(self.request_id, [])
                if self.next_index < len(tokens):
                    token = Token(self.next_index, tokens[self.next_index])
                    self.next_index += 1
                    return token
                row = self.waiter.rows.get(self.request_id)
                if row is not None:
                    return End(row, self.next_index)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.waiter.changed.wait(), left)

    def close(self) -> None:
        self.closed = True
        self.waiter.streams_closed += 1


class StubWaiter:
    """The result store and its announcements, in memory: ``store`` a row and its
    waiter hears it; ``stream`` tokens and a stream sees them."""

    def __init__(self) -> None:
        self.listening = asyncio.Event()
        self.listening.set()
        self.channel = "gristmill_results_0"
        self.rows: dict[str, AnswerRow] = {}
        self.tenants: dict[str, str] = {}  # request id -> tenant
        self.tokens: dict[str, list[str]] = {}
        self.waiting: dict[str, asyncio.Future[AnswerRow]] = {}
        self.changed = asyncio.Condition()
        self.streams_closed = 0

    def register(
        self, request_id: str, received_at: float | None = None
    ) -> asyncio.Future[AnswerRow]:
        if not self.listening.is_set():
            raise Unavailable("results cannot be delivered right now (stub)", reason="results")
        fut = self.waiting.get(request_id)
        if fut is None:
            fut = self.waiting[request_id] = asyncio.get_running_loop().create_future()
        return fut

    def discard(self, request_id: str) -> None:
        self.waiting.pop(request_id, None)

    async def fetch(self, ids: list[str]) -> list[AnswerRow]:
        return [self.rows[i] for i in ids if i in self.rows]

    async def progress(self, request_id: str, tenant_id: str) -> Progress:
        if self.tenants.get(request_id) != tenant_id:
            return Progress(False, None)
        row = self.rows.get(request_id)
        return Progress(row is None and bool(self.tokens.get(request_id)), row)

    def follow(self, request_id: str, tenant_id: str, next_index: int) -> StubStream:
        return StubStream(self, request_id, next_index)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def _changed(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    def store(self, row: AnswerRow, tenant_id: str) -> None:
        """A row is written and announced: its waiter (if any) gets it."""
        rid = row["request_id"]
        self.rows[rid] = row
        self.tenants[rid] = tenant_id
        fut = self.waiting.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_result(row)
        asyncio.get_running_loop().create_task(self._changed())

    def stream(self, request_id: str, tenant_id: str, text: str) -> None:
        self.tokens.setdefault(request_id, []).append(text)
        self.tenants[request_id] = tenant_id
        asyncio.get_running_loop().create_task(self._changed())


@dataclass
class StubKeys:
    """Idempotency-Key claims in memory, as results/idempotency.py keeps them."""

    claims: dict[tuple[str, str], KeyUse] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)

    async def claim(self, use: KeyUse) -> Claim:
        first = self.claims.setdefault((use.tenant_id, use.key), use)
        if first is use:
            return Claim(True, use.request_id, version=use.model_version)
        if first.body_hash != use.body_hash:
            raise IdempotencyConflict(
                "Idempotency-Key was already used with a different request body",
                field="Idempotency-Key",
            )
        at = datetime.fromtimestamp
        return Claim(
            False,
            first.request_id,
            at(first.deadline, UTC),
            at(first.received, UTC),
            first.model_version,
        )

    async def release(self, use: KeyUse) -> None:
        first = self.claims.get((use.tenant_id, use.key))
        if first is not None and first.request_id == use.request_id:
            del self.claims[(use.tenant_id, use.key)]
            self.released.append(use.request_id)


class StubJobs:
    pacer = None  # the intake never pauses

    def __init__(self) -> None:
        self.published: list[str] = []

    async def publish(self, job_id: str, staged: StagedItems | None = None) -> int:
        self.published.append(job_id)
        return 0

    async def claim_stale(self) -> str | None:
        return None

    def close(self) -> None:
        pass


def answer_row(
    msg: RequestMessage,
    *,
    output: Any = None,
    vector: bytes | None = None,
    status: str = RequestStatus.SUCCEEDED,
    error: str | None = None,
) -> AnswerRow:
    """The row the result store writes for ``msg``."""
    now = datetime.now(UTC)
    received = datetime.fromtimestamp(msg.received_at, UTC)
    ran = status == RequestStatus.SUCCEEDED
    return {
        "request_id": msg.request_id,
        "status": status,
        "output": output,
        "output_vector": vector,
        "error": error,
        "model": msg.model,
        "model_version": msg.version,
        "batch_size": 1 if ran else None,
        "received_at": received,
        "consumed_at": now,
        "batched_at": now if ran else None,
        "compute_start_at": now if ran else None,
        "compute_end_at": now if ran else None,
        "persisted_at": now,
    }


class Worker:
    """Answers what is produced, as the scheduler and the workers would: sim's output,
    a vector for an embedding model, a generated text token by token. ``hold`` keeps
    every answer back (a request that misses its deadline), ``held`` those of the
    inputs it names; ``fail`` names inputs that fail."""

    def __init__(self, waiter: StubWaiter, dim: int = 384):
        self.waiter = waiter
        self.dim = dim
        self.hold = False
        self.held: set[str] = set()
        self.fail: set[str] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.generated = ("Hel", "lo", ",", " world")

    def __call__(self, msg: RequestMessage) -> None:
        self.loop = asyncio.get_running_loop()
        if self.hold or input_text(msg.input) in self.held:
            return
        self.loop.call_soon(self.answer, msg)

    def answer_in_loop(self, msg: RequestMessage) -> None:
        """Answer ``msg`` now, from a test's thread (the app runs in its own loop)."""
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self.answer, msg)

    def answer(self, msg: RequestMessage) -> None:
        text = input_text(msg.input)
        if text in self.fail:
            self.waiter.store(
                answer_row(msg, status=RequestStatus.FAILED, error="boom"), msg.tenant_id
            )
        elif msg.model == "gristmill-lm":
            self.generate(msg)
        elif msg.model == "all-minilm-l6-v2":
            vector = from_floats([1.0 / self.dim**0.5] * self.dim)
            self.waiter.store(answer_row(msg, vector=vector), msg.tenant_id)
        else:
            self.waiter.store(answer_row(msg, output=sim_output(text)), msg.tenant_id)

    def generate(self, msg: RequestMessage) -> None:
        rid = msg.request_id
        for piece in self.generated:
            self.waiter.stream(rid, msg.tenant_id, piece)
        offsets, n = [], 0
        for piece in self.generated:
            n += len(piece)
            offsets.append(n)
        output = {
            "text": "".join(self.generated),
            "offsets": offsets,
            "finish_reason": "length",
            "prompt_tokens": len(msg.input["ids"]),
            "completion_tokens": len(self.generated),
        }
        self.waiter.store(answer_row(msg, output=output), msg.tenant_id)


@dataclass
class Stubs:
    settings: Settings
    producer: StubProducer
    waiter: StubWaiter
    keys: StubKeys
    jobs: StubJobs
    worker: Worker
    tenant: Tenant
    key: str
    state: AppState | None = None


def served_catalog(settings: Settings, engine: Any) -> ModelCatalog:
    """The built-in versions, each served by a ready worker, never re-read."""
    catalog = ModelCatalog(settings, engine)
    models = catalog.table.models
    catalog.table = RouteTable(
        models,
        {(r.name, r.version): Served(ready=1) for r in builtin_records(settings)},
    )
    catalog._fetched_at = float("inf")  # no registry to read
    return catalog


def make_stubs(settings: Settings | None = None, tier: str = "paid") -> Stubs:
    s = settings or Settings(allow_weak_durability=True)
    waiter = StubWaiter()
    tenant = Tenant(id="00000000-0000-4000-8000-000000000001", name="t", tier=tier)
    worker = Worker(waiter)
    return Stubs(s, StubProducer(), waiter, StubKeys(), StubJobs(), worker, tenant, new_key())


def stub_services(stubs: Stubs) -> Services:
    """The API's state around the stand-ins (what ``live_services`` makes for real)."""

    @contextlib.asynccontextmanager
    async def services(settings: Settings) -> AsyncIterator[AppState]:
        stubs.producer.on_produce = stubs.worker
        # Never connected: nothing on these paths reads PostgreSQL.
        engine = create_async_engine("postgresql+psycopg://stub@127.0.0.1:9/stub")
        auth = Authenticator(engine, settings)
        auth.found.put(stubs.key, (stubs.tenant, hash_key(stubs.key), None), float("inf"))
        limiter = TenantLimiter()
        waiter = stubs.waiter
        shared = Path(tempfile.mkdtemp(prefix="gristmill-stub-slots-"))
        slots = InstanceSlots.open(shared, settings)
        stubs.state = AppState(
            settings=settings,
            engine=engine,
            producer=stubs.producer,
            waiter=waiter,
            keys=stubs.keys,
            jobs=stubs.jobs,
            auth=auth,
            catalog=served_catalog(settings, engine),
            limiter=limiter,
            inflight=InflightLimiter(settings.max_inflight, settings.inflight_share),
            flex_waits=InflightLimiter(settings.max_flex_waits, {}),
            load=LoadWatch(engine, settings, limiter),
            overload=Overload(),
            uploads=slots.uploads,
            follows=slots.follows,
            read_streams=slots.read_streams,
            readiness=Readiness(
                engine,
                refresh_s=1.0,
                listening=waiter.listening.is_set,
                revocations=bool,
                health=DatabaseHealth(stale_s=settings.load_report_stale_s),
            ),
        )
        try:
            yield stubs.state
        finally:
            slots.close()
            shutil.rmtree(shared, ignore_errors=True)
            await engine.dispose()

    return services


def stub_app(settings: Settings | None = None, tier: str = "paid") -> tuple[ASGIApp, Stubs]:
    """The API as uvicorn serves it, on stand-ins; the tenant's key is ``stubs.key``."""
    stubs = make_stubs(settings, tier)
    return create_asgi(stubs.settings, stub_services(stubs)), stubs
