"""Idempotency-Key handling (after the IETF httpapi Idempotency-Key draft).

A key is claimed in PostgreSQL with the request id it names and a fingerprint of
the body: the same key with another body is a 422; the same body is a retry that
gets the first answer (waiting for it if it is still in flight). A claim whose
request never reached Kafka is released, so the client's retry sends it at once.
Keys live ``idempotency_ttl_h`` hours (24, as documented): the sweeper
(results/sweeper.py, one instance at a time) deletes older claims in batches, and a key
reused after that is a new request with a new request id.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from core.config import Settings
from core.errors import IdempotencyConflict
from core.limits import check_header_token
from ingest.acceptance.ports import Claim, KeyUse
from results.idempotency import claim_key, release_key

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
        """Claim the key for ``use.request_id`` (a fresh id); a retry gets the first
        request's."""
        c = await claim_key(
            self.engine,
            tenant_id=use.tenant_id,
            key=use.key,
            request_id=use.request_id,
            body_hash=use.body_hash,
            deadline_at=datetime.fromtimestamp(use.deadline, tz=UTC),
            received_at=datetime.fromtimestamp(use.received, tz=UTC),
            ttl_h=self.ttl_h,
        )
        if c.first:
            return Claim(True, c.request_id)
        if c.body_hash != use.body_hash:
            raise IdempotencyConflict(
                "Idempotency-Key was already used with a different request body",
                field="Idempotency-Key",
            )
        return Claim(False, c.request_id, c.deadline_at, c.received_at)

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
