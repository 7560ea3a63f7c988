"""Idempotency-Key handling (after the IETF httpapi Idempotency-Key draft).

A key is claimed in PostgreSQL with the request id it names, a fingerprint of the body
and the model version routing picked: the same key with another body is a 422; the same
body is a retry that gets the first answer (waiting for it if it is still in flight). A
claim whose request never reached Kafka is released, so the client's retry sends it at
once. A retry is the same request whatever routing decided meanwhile (a canary started
or rolled back, a promote, a pin): the fingerprint covers only what the caller sent (the
model as it named it, its input and parameters), and a retry that must be sent again
goes to the version its first attempt was routed to (decision 44).
Keys live ``idempotency_ttl_h`` hours (24, as documented): the sweeper
(results/sweeper.py, one instance at a time) deletes older claims in batches, and a key
reused after that is a new request with a new request id.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from core.config import Settings
from core.errors import IdempotencyConflict
from core.limits import check_header_token
from core.messages import RequestMessage
from core.models.spec import ModelSpec
from results.idempotency import claim_key, release_key

if TYPE_CHECKING:
    from ingest.catalog import ModelCatalog

log = logging.getLogger("gristmill.ingest.idempotency")

def check_key(settings: Settings, key: str | None) -> str | None:
    """The header's value (1..max_idempotency_key_chars visible ASCII), or a 400 naming
    it; checked before the body is read."""
    if key is None:
        return None
    return check_header_token(key, "Idempotency-Key", max_chars=settings.max_idempotency_key_chars)


@dataclass(frozen=True)
class Claim:
    first: bool  # this call is the first with the key (or the key had expired)
    request_id: str  # the request the key names: the one to send, fetch or wait for
    first_deadline: datetime | None = None  # when the first attempt's caller gave up
    # When the first attempt was received: a resend carries it, so the request keeps
    # one row (the request log's key includes received_at). None: an old claim.
    first_received: datetime | None = None
    # The version the first attempt was routed to (None: an old claim).
    version: str | None = None


async def claim(
    engine: AsyncEngine,
    *,
    tenant_id: str,
    key: str,
    request_id: str,
    body_hash: str,
    deadline: float,
    received: float,
    model_version: str,
    ttl_h: float = 24.0,
    legacy_hash: Callable[[], str] | None = None,
) -> Claim:
    """Claim ``key`` for ``request_id`` (a fresh id, routed to ``model_version``); a
    retry gets the first request's. ``body_hash`` fingerprints what the caller sent;
    ``legacy_hash`` the same body as claims made before decision 44 fingerprinted it
    (with the routed version), so a retry of one of those is still recognised."""
    c = await claim_key(
        engine,
        tenant_id=tenant_id,
        key=key,
        request_id=request_id,
        body_hash=body_hash,
        deadline_at=datetime.fromtimestamp(deadline, tz=UTC),
        received_at=datetime.fromtimestamp(received, tz=UTC),
        ttl_h=ttl_h,
        model_version=model_version,
    )
    if c.first:
        return Claim(True, c.request_id, version=model_version)
    old = c.model_version is None and legacy_hash is not None and c.body_hash == legacy_hash()
    if c.body_hash != body_hash and not old:
        raise IdempotencyConflict(
            "Idempotency-Key was already used with a different request body",
            field="Idempotency-Key",
        )
    return Claim(False, c.request_id, c.deadline_at, c.received_at, c.model_version)


async def first_version(catalog: ModelCatalog, spec: ModelSpec, c: Claim | None) -> ModelSpec:
    """The spec a retry is sent again on: the version its first attempt was routed to,
    pinned (404 if it was retired since, 503 if no worker serves it now), whatever
    routing picks for new requests; ``spec`` itself for a first attempt."""
    if c is None or c.first or c.version is None or c.version == spec.version:
        return spec
    return await catalog.resolve(f"{spec.name}@{c.version}")


def aim(msg: RequestMessage, spec: ModelSpec, input_: Any) -> None:
    """Point an unsent message at ``spec``'s version (its input as that version takes
    it: token ids where it tokenizes in the API)."""
    msg.model, msg.version, msg.input = spec.name, spec.version, spec.message_input(input_)


async def release(engine: AsyncEngine, *, tenant_id: str, key: str, request_id: str) -> None:
    """The claimed request did not reach Kafka: free the key for the client's retry.
    With the database away too, the claim stays: a retry then resends after the first
    attempt's deadline, as before."""
    try:
        await release_key(engine, tenant_id=tenant_id, key=key, request_id=request_id)
    except (SQLAlchemyError, OSError) as exc:
        log.warning("could not release an idempotency key: %s", exc)
