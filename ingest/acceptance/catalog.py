"""Which models a request may name, and which version answers it.

The registry (results/modelregistry.py) says which versions exist and their states;
the schedulers' readiness reports say which of them some worker can serve. This
instance keeps both in memory, re-read when a registry change is announced
(``NOTIFY gristmill_models``, heard by a listener of its own) and every
``refresh_s`` anyway (readiness is not announced; a missed notification costs at most
that long), so a promote or a rollback reaches every API instance within about a
second. The routing decision itself is ingest/acceptance/routing.py's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import psycopg
from sqlalchemy.ext.asyncio import AsyncEngine

from core.config import ModelSettings
from core.errors import Unavailable
from core.models.registry import (
    RecordError,
    VersionRecord,
    VersionState,
    builtin_records,
    parse_ref,
    spec_from_record,
    version_order,
)
from core.models.spec import ModelSpec
from ingest.acceptance.routing import (
    STICKY_TENANT,
    Decision,
    ModelRoutes,
    RouteTable,
    Served,
    choose,
    known_routes,
    lookup,
    open_versions,
)
from ingest.edge.db_health import DatabaseHealth, report_window_s
from ingest.edge.listener import listen, stop
from results.db import libpq_url
from results.modelregistry import (
    MODELS_CHANNEL,
    READINESS_STALE_S,
    read_registry,
    record_from_row,
)

log = logging.getLogger(__name__)

# A request for a version no worker serves forces a fresh look at the registry, but not
# more often than this (s): a flood of such requests is one query per period.
FORCED_REFRESH_MIN_S = 0.25
# The registry and readiness are re-read this often without a notification (s): the
# bound on how stale a routing decision can be when a NOTIFY is lost.
REFRESH_S = 1.0


def _table(records: list[VersionRecord], sticky: dict[str, str]) -> dict[str, ModelRoutes]:
    by_name: dict[str, dict[str, VersionRecord]] = {}
    for r in records:
        by_name.setdefault(r.name, {})[r.version] = r
    return {n: ModelRoutes(n, vs, sticky.get(n, STICKY_TENANT)) for n, vs in by_name.items()}


class ModelCatalog:
    def __init__(
        self,
        settings: ModelSettings,
        engine: AsyncEngine,
        *,
        database_url: str | None = None,
        deployment: str | None = None,
        refresh_s: float = REFRESH_S,
    ):
        self.settings = settings
        # Readiness from this deployment's schedulers only (a topic prefix: several
        # deployments may share one database, and its one registry).
        self.deployment = deployment
        self.engine = engine
        self.dsn = libpq_url(database_url) if database_url else None
        # The commit time this instance measures (ingest/edge/db_health.py), if set: while
        # commits are slow, the schedulers' readiness reports land late, not never.
        self.health: DatabaseHealth | None = None
        self.refresh_s = refresh_s
        # Until the registry is read: the built-in versions, served by nobody known.
        self.table = RouteTable(_table(builtin_records(settings), {}))
        self._specs: dict[tuple[str, str], ModelSpec] = {}
        self._fetched_at = float("-inf")  # monotonic; the first call fetches
        self._lock = asyncio.Lock()
        self.changes = 0  # registry reads that changed the routes (tests, metrics)

    # ---- reading the registry ---------------------------------------------------------
    async def refresh(self, force: bool = False) -> None:
        period = FORCED_REFRESH_MIN_S if force else self.refresh_s
        if time.monotonic() - self._fetched_at < period:
            return
        async with self._lock:
            if time.monotonic() - self._fetched_at < period:
                return
            await self._read()

    def _stale_s(self) -> float:
        if self.health is None:
            return READINESS_STALE_S
        return report_window_s(READINESS_STALE_S, self.health.commit_s(time.monotonic()))

    async def _read(self) -> None:
        try:
            rows, served = await read_registry(
                self.engine, self.deployment, stale_s=self._stale_s()
            )
        except Exception as exc:  # keep the last known state while PostgreSQL is away
            log.warning("model registry refresh failed: %s", type(exc).__name__)
            self._fetched_at = time.monotonic()  # and do not ask again at once
            return
        records = [record_from_row(r) for r in rows]
        sticky = {r.name: r.sticky for r in rows}
        models = _table(records, sticky)
        if models != self.table.models:
            self.changes += 1
        self.table = RouteTable(models, served)
        self._fetched_at = time.monotonic()

    async def run(self) -> None:
        """Re-read on every announced change and every ``refresh_s``; runs until cancelled."""
        tasks = [asyncio.create_task(self._poll())]
        if self.dsn is not None:
            tasks.append(asyncio.create_task(self._listen()))
        try:
            await asyncio.gather(*tasks)
        finally:
            await stop(tasks)

    async def _poll(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.refresh_s / 4)

    async def _listen(self) -> None:
        assert self.dsn is not None
        await listen(self.dsn, (MODELS_CHANNEL,), self._changed, lost=self._lost)

    async def _changed(self, _note: psycopg.Notify) -> None:
        async with self._lock:
            await self._read()

    def _lost(self, exc: BaseException) -> None:
        if not isinstance(exc, asyncio.CancelledError):
            log.warning("model registry listener lost its connection (%s); retrying", exc)

    # ---- answering ---------------------------------------------------------------------
    def spec(self, record: VersionRecord) -> ModelSpec:
        key = (record.name, record.version)
        spec = self._specs.get(key)
        if spec is None or (spec.sha256, spec.artifact) != (record.sha256, record.artifact):
            spec = self._specs[key] = spec_from_record(record, self.settings)
        return spec

    def listing(self, *, every_version: bool) -> list[dict[str, Any]]:
        """The catalog as tenants see it: ``every_version`` (a caller with a key) or only
        the live ones; never the worker counts (the admin API has those)."""
        out: list[dict[str, Any]] = []
        for name in sorted(self.table.models):
            routes = self.table.models[name]
            for version in sorted(routes.versions, key=version_order):
                r = routes.versions[version]
                if not every_version and r.state is not VersionState.LIVE:
                    continue
                served = self.table.served.get((name, version), Served())
                try:
                    params = {p.name: p.default for p in self.spec(r).params}
                except RecordError:
                    params = {}
                out.append(
                    {
                        "model": name,
                        "version": version,
                        "state": str(r.state),
                        "canary_share": r.canary_share,
                        "backend": r.backend,
                        "max_batch_size": r.max_batch_size,
                        "live": served.ready > 0,
                        "params": params,
                    }
                )
        return out

    def known(self, ref: str) -> ModelSpec:
        """The spec of ``name`` (its live version) or ``name@version`` as the registry
        holds it, served or not (metadata); NotFound naming it if unknown or retired."""
        name, version = parse_ref(ref)
        return self.spec(lookup(self.table, name, version))

    def recorded(self, name: str, version: str) -> ModelSpec | None:
        """The spec of ``name@version`` as registered, in any state (retired too), or
        None when the registry has no such version or no spec can be made of it."""
        routes = self.table.models.get(name)
        record = routes.versions.get(version) if routes is not None else None
        if record is None:
            return None
        try:
            return self.spec(record)
        except RecordError:
            return None

    def versions(self, name: str) -> list[str]:
        """``name``'s versions that are not retired (NotFound if it has none)."""
        return open_versions(known_routes(self.table, name))

    def decide(
        self, ref: str, *, tenant_id: str | None, idempotency_key: str | None = None
    ) -> Decision:
        name, version = parse_ref(ref)
        return choose(
            self.table, name, version, tenant_id=tenant_id, idempotency_key=idempotency_key
        )

    async def resolve(
        self,
        ref: str,
        *,
        tenant_id: str | None = None,
        idempotency_key: str | None = None,
        wait_for_workers: bool = False,
    ) -> ModelSpec:
        """The spec of the version that answers ``name`` or ``name@version`` for this
        caller (ingest/acceptance/routing.py). ``wait_for_workers``: a job's items may wait in Kafka
        for a version no worker serves yet (loading, or its upstream down), so only an
        unknown or retired version is refused.

        Only a catalog never read waits for the registry here: otherwise the background
        poll keeps it current (every ``refresh_s``, and on each announcement), and a
        request never queues behind a registry read that a slow database holds up
        (decision 39); a version the table does not serve still forces a fresh look."""
        if self._fetched_at == float("-inf"):
            await self.refresh()
        try:
            decision = self.decide(ref, tenant_id=tenant_id, idempotency_key=idempotency_key)
        except Unavailable:
            await self.refresh(force=True)
            try:
                decision = self.decide(ref, tenant_id=tenant_id, idempotency_key=idempotency_key)
            except Unavailable:
                if not wait_for_workers:
                    raise
                decision = self._unserved(ref)
        name = parse_ref(ref)[0]
        record = self.table.models[name].versions[decision.version]
        try:
            return self.spec(record)
        except RecordError as exc:  # a row no spec can be made of: an operator's mistake
            log.error("registry row %s is unusable: %s", record.ref, exc)
            raise Unavailable(f"model {record.ref} is misconfigured in the registry") from exc

    def _unserved(self, ref: str) -> Decision:
        """The version a job goes to when no worker serves it yet (no canary for jobs)."""
        name, version = parse_ref(ref)
        if version:
            return Decision(version, "pinned")
        live = self.table.models[name].live()
        if live is None:
            raise Unavailable(f"model {name} has no live version")
        return Decision(live.version, "live")
