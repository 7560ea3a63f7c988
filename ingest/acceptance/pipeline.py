"""The one acceptance pipeline: what every front door does with a request.

A front door (``Door``: /v1/infer, /v1/embeddings, /v1/completions, KServe's infer)
knows its protocol's wire: how to read its body into an ``Order`` and how to answer
an ``Outcome``. Everything between is here, the same for every door:

1. The key was checked by the gate (edge/auth.py), the headers by ``check_headers``,
   before the body was read (a ``Call``).
2. ``serve``: the instance's own saturation and slots (admission/policy.py), for the
   doors that hold one while they answer.
3. The door parses and validates (a 4xx whatever the load), resolving the model.
4. ``run``: the tenant's rate and admission (a generation's KV cache first: its 400
   comes before any charge), the deadline.
5. The Idempotency-Key claimed (ports.IdempotencyKeys) for the first input's id, with
   a fingerprint of what the caller sent (the model as it named it, not the version
   routing picked); the others' ids derive from it, so a retry names the same rows.
6. The messages made (message.py) and every waiter registered, before producing, so a
   fast result cannot slip past.
7. A retry: rows already stored are its answer; the rest are sent again only when the
   first attempt's caller gave up (it may never have reached Kafka) and, for a
   generation, none is generating (same ids: at most one row each either way), to the
   version the first attempt was routed to (decision 44).
8. Produced with acks=all, together (librdkafka's linger puts them in one produce
   request per partition): now they are accepted. A claim of which nothing reached
   Kafka is released, so the client's retry sends at once.
9. Waited for, until the deadline (or less: ``Prefer: wait``), or handed to the door
   as a stream.

A ``flex`` request (acceptance/service_tier.py, decision 66) skips the capacity checks
(the instance's sync slots, admission, the KV cache's wait), is queued behind every sync
tier, and is waited for its caller's patience, on a slot of its own.

Each input is its own request message: the scheduler batches a many-input request's
inputs with everyone else's, exactly as it would as many single requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from starlette.requests import Request

from core import tracing
from core.config import Settings
from core.errors import DeadlineExceeded, Unavailable
from core.ids import uuid7
from core.messages import RequestMessage, body_hash
from core.models.spec import ModelSpec
from core.topics import request_topic
from core.vocab import ServiceTier
from ingest import metrics
from ingest.acceptance import genai
from ingest.acceptance.gateway import (
    FAIRNESS_HEADER,
    OBJECTIVE_HEADER,
    fairness_id,
    objective_tier,
)
from ingest.acceptance.idempotency import check_key
from ingest.acceptance.inputs import (
    default_timeout_ms,
    item_request_id,
)
from ingest.acceptance.message import kept_until, request_message
from ingest.acceptance.ports import Claim, KeyUse
from ingest.acceptance.prefer import NO_PREFERENCE, parse_prefer
from ingest.acceptance.retries import aim_at_first, replay
from ingest.acceptance.service_tier import (
    ECHO_HEADER,
    SERVICE_TIER_HEADER,
    Service,
    flex_timeout_ms,
    may_be_flex,
    patience_s,
    plan_service,
)
from ingest.acceptance.state import AppState
from ingest.acceptance.waiters import ARRIVED_AT
from ingest.admission.policy import (
    check_admission,
    check_kv,
    check_rate,
    check_timeout_floor,
    take_instance_slot,
)
from ingest.edge.auth import received_at
from ingest.edge.refusal_counts import TIMEOUTS, Timeout
from ingest.edge.tracing import annotate
from results.requests import AnswerRow
from results.tenants import Tenant

Headers = Sequence[tuple[bytes, bytes]]  # an ASGI scope's headers: lower-case names
# A door's answer: an HTTP ``Response``, or another protocol's message (KServe's gRPC).
A = TypeVar("A", covariant=True)

# The request path allocates little (slots, no lists for a lone input): the collector's
# passes over long-lived objects were most of the CPU this pipeline first added.


@dataclass(frozen=True, slots=True)
class Call:
    """One request at a front door: its key checked (``tenant``), its headers too, its
    body read (capped in size and time)."""

    tenant: Tenant
    idempotency_key: str | None
    body: bytes
    received: float  # epoch s: when the request arrived
    headers: Headers = ()
    path: Mapping[str, Any] | None = None  # the route's path parameters

    def header_values(self, name: bytes) -> list[str]:
        return [v.decode("latin-1") for k, v in self.headers if k == name]

    def header(self, name: bytes) -> str | None:
        values = self.header_values(name)
        return values[0] if values else None


def check_headers(settings: Settings, idempotency_key: str | None) -> None:
    """What the request's own headers carry, checked before its body is read."""
    check_key(settings, idempotency_key)


async def call_of(
    st: AppState, request: Request, tenant: Tenant, idempotency_key: str | None
) -> Call:
    """A FastAPI route's request as a ``Call``: its headers checked, then its body read
    (BodyLimit caps it, edge/http.py)."""
    check_headers(st.settings, idempotency_key)
    return Call(
        tenant,
        idempotency_key,
        await request.body(),
        received_at(request),
        request.scope["headers"],
        dict(request.path_params),
    )


@dataclass(frozen=True, slots=True)
class Generation:
    """A generation request's size, for admission against the KV cache."""

    prompt_tokens: int
    max_tokens: int


@dataclass(slots=True)
class Order:
    """What a door asks the pipeline to accept: validated inputs of one model version."""

    spec: ModelSpec
    inputs: list[Any]
    params: dict[str, Any]
    # A request of many inputs (an array) is fingerprinted as the list, and its
    # messages carry no fingerprint; a request of one input as that input.
    many: bool = False
    timeout_ms: int | None = None  # the caller's deadline; None: its tier's SLO
    timeout_field: str = "timeout_ms"  # where the caller set it (named by a 400)
    tier: str | None = None  # the tier its messages are scheduled in (None: the key's)
    # How long to wait for the answers at most, from when they are sent (s); None:
    # until the deadline. A generation's deadline is its first token's, so it is waited
    # for this long whatever its deadline.
    wait_s: float | None = None
    generation: Generation | None = None
    stream: bool = False  # hand the accepted request to the door unwaited
    partial: bool = False  # answered at the deadline with what is done (decision 63)
    wire: Any = None  # the door's own parsed request, for its answer
    # What an Idempotency-Key fingerprints (decision 44): the model as the caller named
    # it ("": the spec's ref) and the parameters it sent (None: ``params``), not what
    # routing and the model made of them, so a retry is one whatever routing decides.
    asked: str = ""
    sent: dict[str, Any] | None = None
    # ``params`` for another version of the model, from (its spec, ``wire``): a retry
    # sent again to its first attempt's version. None: the same params.
    reparams: Callable[[ModelSpec, Any], dict[str, Any]] | None = None
    # What the door holds for this order while it answers (a stream's slot), given back
    # here if the order fails before the door's answer takes it over.
    release: Callable[[], None] | None = None
    service_tier: ServiceTier | None = None  # what the caller asked to be served as
    may_wait: bool = True  # False: a flex call this instance cannot hold (202 at once)


def model_defaults(spec: ModelSpec, _wire: Any) -> dict[str, Any]:
    """An ``Order.reparams`` for doors that send the model's default parameters."""
    return spec.normalize_params(None)


@dataclass(slots=True)
class Outcome:
    """What became of an order: every row (in input order) when all finished in time,
    else None; the ids to fetch them by later either way."""

    request_ids: list[str]
    messages: list[RequestMessage]
    rows: list[AnswerRow] | None
    limit_headers: dict[str, str]
    timeout_ms: int
    retry: bool = False  # the Idempotency-Key named an earlier request
    replayed: bool = False  # every row was stored before this call: a retry's answer
    unanswered: Sequence[RequestMessage] = ()
    finished: list[AnswerRow | None] | None = None  # a partial order's: each input's row
    # Its gen_ai.server.* metrics: a sync answer's recorded by ``serve``, a stream's by
    # its door when the stream ends.
    meter: genai.Meter | None = None
    service: Service | None = None  # how it was served (its tier echoed)
    deferred: bool = False  # flex, not done within its caller's patience: a 202
    quote: int | None = None  # a deferred one's completion quote (unix s, decision 69)

    @property
    def served(self) -> str:
        """The service tier the answer echoes."""
        return ServiceTier.DEFAULT if self.service is None else self.service.served

    def gave_up(self, message: str) -> DeadlineExceeded:
        """The 504 of a sync request whose deadline passed (``timed_out``)."""
        self.timed_out()
        return DeadlineExceeded(message)

    def timed_out(self) -> None:
        """Its unanswered inputs remembered as timed out, so the request log tells a
        result stored later from one answered in time."""
        now = time.time()
        for m in self.unanswered:
            TIMEOUTS.record(Timeout(m.request_id, m.tenant_id, m.received_at, now))


class Door(Protocol[A]):
    """A front door: its protocol's wire on both sides of the pipeline (HTTP's
    ``Response``, or another protocol's answer ``A``)."""

    holds_slot: bool  # holds one of the instance's in-flight slots while it answers

    async def order(self, st: AppState, call: Call) -> Order:
        """The body parsed, the model resolved, every input validated (4xx)."""
        ...

    def answer(self, st: AppState, call: Call, order: Order, outcome: Outcome) -> A:
        """The door's answer; raises the error to answer with (edge/http.py maps it)."""
        ...


R = TypeVar("R")


async def serve(st: AppState, door: Door[R], call: Call) -> R:
    """A front door's request, from its body to its answer."""
    held, refused = door.holds_slot, None
    if held:
        try:
            take_instance_slot(st.overload, st.inflight, st.settings, call.tenant.tier)
        except Unavailable as exc:  # for sync work: a flex request is still taken
            if not may_be_flex(call.body, call.header(SERVICE_TIER_HEADER)):
                raise
            held, refused = False, exc
    order: Order | None = None
    flex_held = False
    try:
        order = await door.order(st, call)
        if order.service_tier is ServiceTier.FLEX:
            if held:  # a flex call waits on a slot of its own, not a sync one
                st.inflight.release()
                held = False
            if not order.stream:
                flex_held = order.may_wait = st.flex_waits.try_acquire(ServiceTier.FLEX)
        elif refused is not None:
            raise refused
        try:
            outcome = await run(st, call, order)
            response = door.answer(st, call, order, outcome)
        except BaseException:
            if order.release is not None:
                order.release()
            raise
        if not order.stream and outcome.meter is not None:
            outcome.meter.finished(time.time(), outcome.rows or ())
        return response
    except Exception as exc:
        if order is not None:  # its model resolved: the gen_ai.* labels are the registry's
            genai.Meter.of(order, (), call.received).finished(time.time(), error=exc)
        raise
    finally:
        if held:
            st.inflight.release()
        if flex_held:
            st.flex_waits.release()


def _admit(
    st: AppState, tenant: Tenant, order: Order, timeout_ms: int, deadline: float, flex: bool
) -> dict[str, str]:
    """The tenant's rate and admission (decision 24); the answer's RateLimit-* headers.
    ``flex``: never refused for capacity, only for what the caller can change."""
    s, n, ref = st.settings, len(order.inputs), order.spec.ref
    if order.generation is not None:
        g = order.generation
        check_kv(st.load, tenant, ref, g.prompt_tokens, g.max_tokens, deadline, waits=not flex)
        return check_rate(st.limiter, s, tenant, items=n)
    if order.timeout_ms is not None:  # before the rate: an impossible ask costs nothing
        check_timeout_floor(st.load.view, s, ref, order.timeout_ms, order.timeout_field)
    headers = check_rate(st.limiter, s, tenant, items=n)
    if not flex:
        check_admission(st.load, s, tenant, ref, timeout_ms)
    return headers


async def run(st: AppState, call: Call, order: Order) -> Outcome:
    """Admit, claim, make durable and wait for ``order`` (validated by its door).
    Raises 429/503 before anything is produced."""
    s, tenant, key, spec = st.settings, call.tenant, call.idempotency_key, order.spec
    n = len(order.inputs)
    hint = objective_tier(s.gateway_objective_tiers, call.header(OBJECTIVE_HEADER))
    service = plan_service(order.service_tier, tenant.tier, order.tier, hint)
    if service.flex:
        timeout_ms = flex_timeout_ms(order.timeout_ms, s.flex_timeout_ms)
    else:
        slo_ms = s.tier_slo_ms.get(tenant.tier, s.default_timeout_ms)
        timeout_ms = order.timeout_ms or default_timeout_ms(
            slo_ms, n, spec.max_batch_size, s.max_timeout_ms
        )
    deadline = call.received + timeout_ms / 1000
    keep = kept_until(call.received, deadline, s.max_timeout_ms) if order.partial else None
    flow = fairness_id(call.header(FAIRNESS_HEADER))  # a 400 before anything is charged
    limit_headers = _admit(st, tenant, order, timeout_ms, deadline, service.flex)
    limit_headers[ECHO_HEADER] = service.served
    prefer = parse_prefer(call.header_values(b"prefer")) if service.flex else NO_PREFERENCE
    order.wait_s = patience_s(service, order.wait_s, prefer, s.flex_wait_ms / 1000, order.may_wait)
    # Ordered by receipt (decision 72): new rows land on the request log index's edge.
    first, claim, use = uuid7(int(call.received * 1000)), None, None
    if key is not None:
        what = order.inputs if order.many else order.inputs[0]
        sent = order.params if order.sent is None else order.sent
        fingerprint = body_hash(order.asked or spec.ref, what, sent)
        use = KeyUse(
            tenant.id,
            key,
            first,
            fingerprint,
            keep or deadline,  # a retry resends after it; a partial order's inputs run on
            call.received,
            spec.version,
            # As claims before decision 44 fingerprinted it (the routed version's ref).
            lambda: body_hash(spec.ref, what, order.params),
        )
        claim = await st.keys.claim(use)
        first = claim.request_id  # a retry: the first attempt's
    ids: list[str] = []
    msgs: list[RequestMessage] = []
    for i, value in enumerate(order.inputs):
        rid = item_request_id(first, i)
        ids.append(rid)
        msgs.append(
            request_message(
                spec,
                value,
                order.params,
                tenant=tenant,
                request_id=rid,
                received=call.received,
                timeout_ms=timeout_ms,
                # A lone input's message carries the claim's fingerprint; a request
                # of many is fingerprinted once, as the list.
                fingerprint=use.body_hash if use is not None and not order.many else "",
                tier=service.tier,
                fairness_id=flow,
                keep=keep,
                priority=service.priority,
                service_tier=service.served,
                reply_to=st.waiter.channel,
            )
        )
    retry = claim is not None and not claim.first
    if retry and claim is not None and claim.first_received is not None:
        # A retry's messages carry the first attempt's time (the request log's partition
        # key; the deadline stays this attempt's), so a resend meets the rows it wrote.
        for m in msgs:
            m.received_at = claim.first_received.timestamp()
    if tracing.enabled():
        annotate(ids[0], spec.ref, tenant.tier, genai.span_attributes(order, msgs))
    futs: list[asyncio.Future[AnswerRow]] = []
    try:
        for rid, m in zip(ids, msgs, strict=True):
            futs.append(st.waiter.register(rid, m.received_at))
        send = True
        pending: Sequence[int] = range(n)
        if retry and claim is not None:
            send = await replay(st, tenant, order, claim, ids, futs)
            pending = [i for i, f in enumerate(futs) if not f.done()]
            if send and pending:
                await aim_at_first(st, order, claim, msgs, pending)
        if send and pending:
            picked = msgs if len(pending) == n else [msgs[i] for i in pending]
            await _send(st, tenant, picked, claim, use)
        out = Outcome(ids, msgs, None, limit_headers, timeout_ms, retry, retry and not pending)
        out.meter, out.service = genai.Meter.of(order, msgs, call.received), service
        if order.stream:
            return out
        if pending:
            await _wait(order, futs, pending, deadline)
        if not all(f.done() for f in futs):
            out.deferred = service.flex and time.time() < deadline
            if out.deferred and st.quote_flex is not None:
                out.quote = await st.quote_flex(tenant, spec, sum(not f.done() for f in futs))
            out.unanswered = [m for m, f in zip(msgs, futs, strict=True) if not f.done()]
            if order.partial:
                out.finished = [f.result() if f.done() else None for f in futs]
            return out
        out.rows = [f.result() for f in futs]
        _answered(st, msgs, out.rows, pending)
        return out
    finally:
        for rid in ids:
            st.waiter.discard(rid)


async def _send(
    st: AppState,
    tenant: Tenant,
    msgs: list[RequestMessage],
    claim: Claim | None,
    use: KeyUse | None,
) -> None:
    """Every message produced at once and awaited together. Those that are durable run
    and are stored under their own ids; if any is not, the first failure (a 503)."""
    headers = tracing.headers()
    s = st.settings
    if len(msgs) == 1:  # the hot path: no task and no lists for a lone message
        m = msgs[0]
        try:
            await st.producer.produce(request_topic(s, m.priority), m.encode(), headers=headers)
        except Unavailable:
            if claim is not None and claim.first and use is not None:
                await st.keys.release(use)  # nothing reached Kafka: the retry sends at once
            raise
        metrics.admitted(tenant.tier)
        return
    outcomes = await asyncio.gather(
        *(
            st.producer.produce(request_topic(s, m.priority), m.encode(), headers=headers)
            for m in msgs
        ),
        return_exceptions=True,
    )
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    for _ in range(len(outcomes) - len(failed)):
        metrics.admitted(tenant.tier)
    if not failed:
        return
    if claim is not None and claim.first and len(failed) == len(outcomes) and use is not None:
        # Nothing reached Kafka: the client's retry sends it all again at once. (When
        # some did, the claim stays: a retry after this deadline resends the rest.)
        await st.keys.release(use)
    raise failed[0]


async def _wait(
    order: Order, futs: list[asyncio.Future[AnswerRow]], pending: Sequence[int], deadline: float
) -> None:
    """Until the pending answers are in, the deadline passed or the order's wait ran out."""
    if order.generation is not None and order.wait_s is not None:
        wait = order.wait_s
    else:
        wait = max(0.0, deadline - time.time())
        if order.wait_s is not None:
            wait = min(wait, order.wait_s)
    if wait <= 0:
        return
    if len(pending) == 1:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(futs[pending[0]]), timeout=wait)
        return
    await asyncio.wait([futs[i] for i in pending], timeout=wait)


def _answered(
    st: AppState, msgs: list[RequestMessage], rows: list[AnswerRow], heard: Sequence[int]
) -> None:
    """Answers heard (not replayed) reach their callers now: the stage metrics, and the
    delay since the last reached this instance (what the overload guard sheds on,
    decision 15: this instance's own part, not the database's commit)."""
    if not heard:
        return
    now = time.time()
    last: float | None = None
    for i in heard:
        row = rows[i]
        metrics.answered(msgs[i], row, now)
        arrived = row.get(ARRIVED_AT)
        if arrived is not None:
            last = arrived if last is None else max(last, arrived)
    if last is not None:
        st.overload.answer.observe((now - last) * 1000)
