"""Many inputs in one HTTP request (an OpenAI embeddings array, a KServe batch), on the
same durable path as ``POST /v1/infer``.

Each input becomes its own request message: the scheduler batches them with everyone
else's, exactly as it would as many single requests, and each has its own result row.
They are produced together (librdkafka's linger puts them in one produce request per
partition), acknowledged once Kafka has every one, and waited for together; the
answer holds them in input order.

An ``Idempotency-Key`` names the whole request: the key is claimed once, for input
0's id and with a fingerprint of the model as the caller named it and every input;
input ``i``'s id is derived from input 0's, so a retry names the same rows (and waits
for those still running), sent again (if at all) to the version the first attempt was
routed to; the same key with other inputs is a 422.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from core import tracing
from core.errors import InvalidInput
from core.messages import RequestMessage, body_hash
from core.models.spec import ModelSpec
from core.topics import request_topic
from core.vocab import TIER_TO_CLASS
from ingest import metrics
from ingest.idempotency import aim, claim, first_version, release
from ingest.infer import request_message
from ingest.policy import check_admission, check_rate
from ingest.state import AppState
from ingest.tracing import annotate
from results.tenants import Tenant


def validate_each(spec: ModelSpec, inputs: list[Any], field_of: Callable[[int], str]) -> None:
    """The model's checks on every input; an error names the input it is about."""
    for i, value in enumerate(inputs):
        try:
            spec.validate_input(value)
        except InvalidInput as exc:
            where = field_of(i)
            raise InvalidInput(exc.message.replace("input", where, 1), field=where) from None


def item_request_id(first: str, index: int) -> str:
    """Input ``index``'s request id, from input 0's (which an Idempotency-Key claims):
    every retry of the request names the same rows."""
    return first if index == 0 else str(uuid.uuid5(uuid.UUID(first), str(index)))


def default_timeout_ms(slo_ms: int, n: int, max_batch: int, max_timeout_ms: int) -> int:
    """The deadline of ``n`` inputs when the client sets none: the tier's SLO for each
    batch they fill at least (n / the model's largest batch, rounded up), since one
    worker runs those batches one after another; never past ``max_timeout_ms``."""
    return min(max_timeout_ms, slo_ms * -(-n // max_batch))


@dataclass
class Submitted:
    """What became of a many-input request: every row (in input order) when all are
    finished within the wait, else None and the ids to fetch them by later."""

    request_ids: list[str]
    messages: list[RequestMessage]
    rows: list[dict[str, Any]] | None
    limit_headers: dict[str, str]


async def submit_many(
    st: AppState,
    tenant: Tenant,
    spec: ModelSpec,
    inputs: list[Any],
    params: dict[str, Any],
    *,
    received: float,
    timeout_ms: int | None,
    idempotency_key: str | None,
    asked: str,
    wait_s: float | None = None,
    tier: str | None = None,
) -> Submitted:
    """Admit, make durable and wait for ``inputs`` (validated by the caller).

    ``timeout_ms``: the deadline (None: the tier's SLO); ``asked``: the model as the
    caller named it (what an Idempotency-Key fingerprints, with the inputs);
    ``wait_s``: how long to wait at most, which may be shorter (a ``Prefer: wait``);
    ``tier``: the tier the messages are scheduled in, never above the key's own (a
    client may lower its priority, not raise it). Raises 429/503 before anything is
    produced."""
    s = st.settings
    limit_headers = check_rate(st.limiter, s, tenant, items=len(inputs))
    if timeout_ms is None:
        slo = s.tier_slo_ms.get(tenant.tier, s.default_timeout_ms)
        timeout_ms = default_timeout_ms(slo, len(inputs), spec.max_batch_size, s.max_timeout_ms)
    check_admission(st.load, s, tenant, spec.ref, timeout_ms)
    deadline = received + timeout_ms / 1000
    c = None
    first = str(uuid.uuid4())
    if idempotency_key is not None:
        c = await claim(
            st.engine,
            tenant_id=tenant.id,
            key=idempotency_key,
            request_id=first,
            body_hash=body_hash(asked, inputs, {}),
            deadline=deadline,
            received=received,
            model_version=spec.version,
            ttl_h=s.idempotency_ttl_h,
            legacy_hash=lambda: body_hash(spec.ref, inputs, params),
        )
        first = c.request_id  # a retry: the first attempt's
    ids = [item_request_id(first, i) for i in range(len(inputs))]
    msgs = [
        request_message(
            spec,
            value,
            params,
            tenant=tenant,
            request_id=rid,
            received=received,
            timeout_ms=timeout_ms,
        )
        for rid, value in zip(ids, inputs, strict=True)
    ]
    if tier is not None:
        for m in msgs:
            m.priority = TIER_TO_CLASS[tier]
    if c is not None and not c.first and c.first_received is not None:
        # A retry's messages carry the first attempt's time (the request log's
        # partition key; the deadline stays this attempt's), so a resend meets the
        # rows the first one wrote.
        for m in msgs:
            m.received_at = c.first_received.timestamp()
    annotate(ids[0], spec.ref, tenant.tier)
    futs = [st.waiter.register(rid) for rid in ids]
    try:
        pending = list(range(len(ids)))
        send = True
        if c is not None and not c.first:
            done = {str(r["request_id"]): r for r in await st.waiter.fetch(ids)}
            for i, rid in enumerate(ids):
                if rid in done and not futs[i].done():
                    futs[i].set_result(done[rid])
            pending = [i for i in pending if not futs[i].done()]
            # Still running: wait for the first attempt, unless its caller gave up, in
            # which case some may never have reached Kafka: send those again (same
            # ids, so at most one result row each either way), to the first's version.
            send = c.first_deadline is not None and c.first_deadline < datetime.now(UTC)
            if send and pending and (v := await first_version(st.catalog, spec, c)) is not spec:
                for i in pending:
                    aim(msgs[i], v, inputs[i])
        if send and pending:
            produced, error = await _produce_all(st, [msgs[i] for i in pending], tenant.tier)
            if error is not None:
                if c is not None and c.first and produced == 0 and idempotency_key is not None:
                    # Nothing reached Kafka: the client's retry sends it all again at once.
                    # (When some did, the claim stays: a retry after this deadline
                    # resends the rest under the same ids.)
                    await release(
                        st.engine, tenant_id=tenant.id, key=idempotency_key, request_id=first
                    )
                raise error
        wait = max(0.0, deadline - time.time())
        if wait_s is not None:
            wait = min(wait, wait_s)
        if pending and wait > 0:
            await asyncio.wait([futs[i] for i in pending], timeout=wait)
        if not all(f.done() for f in futs):
            return Submitted(ids, msgs, None, limit_headers)
        rows = [f.result() for f in futs]
        now = time.time()
        for m, row in zip(msgs, rows, strict=True):
            metrics.answered(m, row, now)
        return Submitted(ids, msgs, rows, limit_headers)
    finally:
        for rid in ids:
            st.waiter.discard(rid)


async def _produce_all(
    st: AppState, msgs: list[RequestMessage], tier: str
) -> tuple[int, BaseException | None]:
    """Hand every message to the producer at once and await them together: how many
    are durable in Kafka, and the first failure (a 503) if any was not. Those that are
    durable run and are stored under their own ids."""
    headers = tracing.headers()
    outcomes = await asyncio.gather(
        *(
            st.producer.produce(request_topic(st.settings, m.priority), m.encode(), headers=headers)
            for m in msgs
        ),
        return_exceptions=True,
    )
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    for _ in range(len(outcomes) - len(failed)):
        metrics.admitted(tier)
    return len(outcomes) - len(failed), (failed[0] if failed else None)
