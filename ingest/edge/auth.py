"""API key authentication that is cheap to attack.

The tenant and its tier come from the key, never from the body. In order, each
step cheaper than the next: the header's shape, then the key's shape (only what
``new_key`` makes can match), then two bounded LRU caches (keys found, keys not
found), then one database lookup per key at a time (single flight) through a
small gate of concurrent lookups, so a flood of made-up keys queues here instead
of taking the connection pool. ``AuthGate`` runs all of it from the headers,
before any route reads a body, and leaves the tenant in the request's scope: routes
read it (``Caller``), they never authenticate again.

Revocation: ``results.tenants.revoke_key`` (and a plan change) sends a NOTIFY that
every API instance hears within milliseconds and drops what it cached. While the
listener is not connected, found keys are trusted for ``auth_revocation_s`` (2 s)
instead of ``auth_cache_s``, and the cache is emptied when it reconnects, so a
revoked key stops working on every instance within 2 s either way.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Annotated, Generic, TypeVar

import psycopg
from fastapi import Depends, Request
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.types import ASGIApp, Receive, Scope, Send

from core.config import Settings
from core.errors import Forbidden, GristmillError, Unauthorized, Unavailable
from ingest.edge.error_shapes import shape_for
from ingest.edge.http import error_response
from ingest.edge.listener import listen, stop
from ingest.edge.refusal_counts import current_tenant
from results.db import libpq_url
from results.tenants import KEYS_CHANNEL, Tenant, hash_key, lookup_stmt, well_formed

log = logging.getLogger(__name__)

V = TypeVar("V")
# A key found: its tenant, its hash, and the actor it names if it has the admin scope.
Found = tuple[Tenant, str, str | None]


class KeyCache(Generic[V]):
    """At most ``max_entries`` values, each until its expiry; least recently used goes
    first. Pure: the caller passes the clock."""

    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[V, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, now: float) -> V | None:
        hit = self._entries.get(key)
        if hit is None:
            return None
        if hit[1] <= now:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return hit[0]

    def put(self, key: str, value: V, expires_at: float) -> None:
        if self.max_entries <= 0:
            return
        self._entries[key] = (value, expires_at)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def drop(self, match: Callable[[V], bool]) -> int:
        gone = [k for k, (v, _) in self._entries.items() if match(v)]
        for k in gone:
            del self._entries[k]
        return len(gone)

    def clear(self) -> None:
        self._entries.clear()


def bearer_key(authorization: str | None) -> str:
    """The key of an ``Authorization: Bearer <key>`` header, or 401. No lookup."""
    if not authorization:
        raise Unauthorized("missing Authorization header (expected 'Bearer <api key>')")
    scheme, _, key = authorization.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise Unauthorized("Authorization header must be 'Bearer <api key>'")
    if not well_formed(key):
        raise Unauthorized("malformed API key (expected 'gm_' and 43 URL-safe characters)")
    return key


class Authenticator:
    def __init__(self, engine: AsyncEngine, settings: Settings):
        self.engine = engine
        self.dsn = libpq_url(settings.database_url)
        self.ttl_s = settings.auth_cache_s
        self.revocation_s = settings.auth_revocation_s
        self.negative_ttl_s = settings.auth_negative_ttl_s
        # Found keys keep their hash, so a revocation (announced by hash) finds them, and
        # for an admin key the actor its audit trail names (None: not an admin key).
        self.found: KeyCache[Found] = KeyCache(settings.auth_cache_size)
        self.missing: KeyCache[bool] = KeyCache(settings.auth_negative_cache_size)
        self._lookups: dict[str, asyncio.Future[Found | None]] = {}
        self._gate = asyncio.Semaphore(settings.auth_max_lookups)
        self.listening = False  # the revocation listener is connected
        # Bumped by every announcement: a lookup that raced one does not cache its answer.
        self._generation = 0
        self._task: asyncio.Task[None] | None = None

    def trust_s(self) -> float:
        """How long a found key is cached: revocations are heard, or they are not."""
        return self.ttl_s if self.listening else min(self.ttl_s, self.revocation_s)

    async def _lookup(self, key: str) -> Found | None:
        key_hash = hash_key(key)
        generation = self._generation
        try:
            async with self._gate, self.engine.connect() as conn:
                row = (await conn.execute(lookup_stmt(key))).first()
        except (SQLAlchemyError, OSError) as exc:
            raise Unavailable(
                "cannot reach the database to check the API key",
                retry_after_s=2,
                reason="database",
            ) from exc
        now = time.monotonic()
        if row is None:
            self.missing.put(key, True, now + self.negative_ttl_s)
            return None
        tenant = Tenant(
            str(row.id),
            row.name,
            row.tier,
            row.weight,
            row.rate_rps,
            row.burst,
            row.job_items_per_s,
        )
        actor = f"key {row.prefix}... of tenant {row.name}" if row.admin else None
        found = (tenant, key_hash, actor)
        if generation == self._generation:
            self.found.put(key, found, now + self.trust_s())
        return found

    async def _found(self, authorization: str | None) -> Found:
        key = bearer_key(authorization)
        now = time.monotonic()
        hit = self.found.get(key, now)
        if hit is None:
            if self.missing.get(key, now):
                raise Unauthorized("unknown or revoked API key")
            # Single flight: a burst of requests with a cold key shares one lookup.
            pending = self._lookups.get(key)
            if pending is None:
                pending = asyncio.ensure_future(self._lookup(key))
                self._lookups[key] = pending
                pending.add_done_callback(lambda _: self._lookups.pop(key, None))
            hit = await asyncio.shield(pending)
            if hit is None:
                raise Unauthorized("unknown or revoked API key")
        current_tenant.set((hit[0].id, hit[0].tier))  # refusals from here are its own
        return hit

    async def authenticate(self, authorization: str | None) -> Tenant:
        return (await self._found(authorization))[0]

    async def admin(self, authorization: str | None) -> str:
        """The actor an admin key names (for audit trails): 401 for a bad key, 403 for a
        key without the admin scope. The same caches and gate as every key."""
        actor = (await self._found(authorization))[2]
        if actor is None:
            raise Forbidden("this key has no admin scope; operator routes need an admin key")
        return actor

    # --- revocations ---

    def hear(self, payload: str) -> int:
        """Drop what a revocation or plan change announced; returns entries dropped."""
        self._generation += 1
        kind, _, value = payload.partition(":")
        if kind == "key":
            return self.found.drop(lambda entry: entry[1] == value)
        if kind == "tenant":
            return self.found.drop(lambda entry: entry[0].id == value)
        log.warning("unreadable key announcement %r; forgetting every cached key", payload[:80])
        self.found.clear()
        return 0

    def _lost(self) -> None:
        # Announcements may be missed from now on: nothing cached before is trusted.
        self.listening = False
        self._generation += 1
        self.found.clear()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listen())

    async def stop(self) -> None:
        await stop([self._task])

    async def _listen(self) -> None:
        await listen(
            self.dsn, (KEYS_CHANNEL,), self._note, connected=self._connected, lost=self._gone
        )

    async def _connected(self) -> None:
        self.found.clear()  # whatever was revoked while we were away
        self._generation += 1
        self.listening = True

    async def _note(self, note: psycopg.Notify) -> None:
        self.hear(note.payload)

    def _gone(self, exc: BaseException) -> None:
        if self.listening and not isinstance(exc, asyncio.CancelledError):
            log.warning("key revocation listener lost its connection (%s)", exc)
        self._lost()


# KServe's inference (its health and metadata are public, as the protocol's probes expect).
_KSERVE_INFER = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/infer$")


def needs_key(scope: Scope, public: frozenset[str]) -> bool:
    """Whether a request must carry a key: every ``/v1/`` path but ``public`` ones, and
    KServe's inference."""
    path = scope["path"]
    if path.startswith("/v1/"):
        return path not in public
    return scope["method"] == "POST" and _KSERVE_INFER.match(path) is not None


async def authenticate_scope(auth: Authenticator, scope: Scope) -> Tenant:
    """The request's tenant from its ``Authorization`` header (401/503 raised), kept in
    its scope for the route (``caller``) and stamped with when it arrived."""
    state = scope.setdefault("state", {})
    if "received" not in state:
        state["received"] = time.time()
    authorization = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            authorization = value.decode("latin-1")
            break
    tenant = await auth.authenticate(authorization)
    state["tenant"] = tenant
    return tenant


class AuthGate:
    """Authenticates every request that needs a key (``needs_key``) from its headers
    before the route, or anything else, reads its body: a bad key costs no body."""

    def __init__(self, app: ASGIApp, *, public: frozenset[str] = frozenset({"/v1/models"})):
        self.app = app
        self.public = public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not needs_key(scope, self.public):
            await self.app(scope, receive, send)
            return
        try:
            await authenticate_scope(scope["app"].state.gristmill.auth, scope)
        except GristmillError as exc:
            await error_response(exc, shape_for(scope["path"]))(scope, receive, send)
            return
        await self.app(scope, receive, send)


def caller(request: Request) -> Tenant:
    """The tenant the gate authenticated for this request."""
    tenant: Tenant | None = request.scope.get("state", {}).get("tenant")
    if tenant is None:  # a route that reads a tenant on a path the gate does not check
        raise RuntimeError(f"{request.url.path} is not behind AuthGate (edge/auth.py needs_key)")
    return tenant


def received_at(request: Request) -> float:
    """When the request arrived (epoch s), as the gate stamped it."""
    received: float = request.scope.get("state", {}).get("received") or time.time()
    return received


# A route's tenant, as a FastAPI dependency: ``tenant: Caller``.
Caller = Annotated[Tenant, Depends(caller)]
