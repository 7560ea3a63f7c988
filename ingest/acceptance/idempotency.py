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
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from core.config import Settings
from core.errors import IdempotencyConflict
from core.limits import check_header_token
from core.messages import RequestMessage
from core.models.spec import ModelSpec
from ingest.acceptance.ports import Claim, KeyUse
from results.idempotency import claim_key, release_key

if TYPE_CHECKING:
    from ingest.acceptance.catalog import ModelCatalog

log = logging.getLogger(__name__)


def check_key(settings: Settings, key: str | None) -> str | None:
    """The header's value (1..max_idempotency_key_chars visible ASCII), or a 400 naming
    it; checked before the body is read."""
    if key is None:
        return None
    return check_header_token(key, "Idempotency-Key", max_chars=settings.max_idempotency_key_chars)


async def claim(engine: AsyncEngine, *, ttl_h: float = 24.0, **use: Any) -> Claim:
    """``KeyClaims.claim`` of one ``KeyUse``, its fields given as keywords."""
    return await KeyClaims(engine, ttl_h=ttl_h).claim(KeyUse(**use))


class KeyClaims:
    """The claims in PostgreSQL (``IdempotencyKeys``), kept ``ttl_h`` hours."""

    def __init__(self, engine: AsyncEngine, *, ttl_h: float):
        self.engine = engine
        self.ttl_h = ttl_h

    async def claim(self, use: KeyUse) -> Claim:
        """Claim the key for ``use.request_id`` (a fresh id, routed to
        ``use.model_version``); a retry gets the first request's. A claim made before
        decision 44 is matched by ``use.legacy_hash``, the fingerprint it recorded."""
        c = await claim_key(
            self.engine,
            tenant_id=use.tenant_id,
            key=use.key,
            request_id=use.request_id,
            body_hash=use.body_hash,
            deadline_at=datetime.fromtimestamp(use.deadline, tz=UTC),
            received_at=datetime.fromtimestamp(use.received, tz=UTC),
            ttl_h=self.ttl_h,
            model_version=use.model_version,
        )
        if c.first:
            return Claim(True, c.request_id, version=use.model_version)
        if c.body_hash != use.body_hash and not _legacy(c.model_version, c.body_hash, use):
            raise IdempotencyConflict(
                "Idempotency-Key was already used with a different request body",
                field="Idempotency-Key",
            )
        return Claim(False, c.request_id, c.deadline_at, c.received_at, c.model_version)

    async def release(self, use: KeyUse) -> None:
        """The claimed request did not reach Kafka: free the key for the client's retry.
        With the database away too, the claim stays: a retry then resends after the
        first attempt's deadline, as before."""
        try:
            await release_key(
                self.engine, tenant_id=use.tenant_id, key=use.key, request_id=use.request_id
            )
        except (SQLAlchemyError, OSError) as exc:
            log.warning("could not release an idempotency key: %s", exc)


def _legacy(version: str | None, recorded: str, use: KeyUse) -> bool:
    """Whether a claim made before decision 44 (no version) fingerprinted this body."""
    return version is None and use.legacy_hash is not None and recorded == use.legacy_hash()


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
