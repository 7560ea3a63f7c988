"""API key authentication with a short cache, so a request costs no DB round trip.

The tenant and its tier come from the key, never from the body. Revocation
takes effect within ``auth_cache_s``.
"""

from __future__ import annotations

import asyncio
import time

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from core.errors import Unauthorized, Unavailable
from results.tenants import Tenant, lookup_stmt

_NEGATIVE_TTL_S = 1.0


class Authenticator:
    def __init__(self, engine: AsyncEngine, *, ttl_s: float):
        self.engine = engine
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[Tenant | None, float]] = {}
        self._lookups: dict[str, asyncio.Future[Tenant | None]] = {}

    async def _lookup(self, key: str) -> Tenant | None:
        try:
            async with self.engine.connect() as conn:
                row = (await conn.execute(lookup_stmt(key))).first()
        except (SQLAlchemyError, OSError) as exc:
            raise Unavailable(
                "cannot reach the database to check the API key",
                retry_after_s=2,
                reason="database",
            ) from exc
        tenant = (
            Tenant(
                str(row.id),
                row.name,
                row.tier,
                row.weight,
                row.rate_rps,
                row.burst,
                row.job_items_per_s,
            )
            if row
            else None
        )
        self._cache[key] = (tenant, time.monotonic() + (self.ttl_s if tenant else _NEGATIVE_TTL_S))
        if len(self._cache) > 100_000:  # bound memory under a key-guessing flood
            self._cache.clear()
        return tenant

    async def authenticate(self, authorization: str | None) -> Tenant:
        if not authorization:
            raise Unauthorized("missing Authorization header (expected 'Bearer <api key>')")
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthorized("Authorization header must be 'Bearer <api key>'")
        key = key.strip()
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[1] > now:
            tenant = hit[0]
        else:
            # Single flight: a burst of requests with a cold key shares one lookup
            # instead of sending the database one query each.
            pending = self._lookups.get(key)
            if pending is None:
                pending = asyncio.ensure_future(self._lookup(key))
                self._lookups[key] = pending
                pending.add_done_callback(lambda _: self._lookups.pop(key, None))
            tenant = await asyncio.shield(pending)
        if tenant is None:
            raise Unauthorized("unknown or revoked API key")
        return tenant
