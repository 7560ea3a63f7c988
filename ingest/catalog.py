"""Which models a request may name: code-level specs joined with the live registry.

A model is routable when its spec is known here (so its input can be
validated) and some scheduler announced a live worker for it recently.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy.ext.asyncio import AsyncEngine

from core.errors import NotFound, Unavailable
from core.limits import shown
from core.models.catalog import latest
from core.models.spec import ModelSpec
from results.modelregistry import live_stmt

log = logging.getLogger("gristmill.ingest.catalog")


def _version_order(v: str) -> tuple[int, str]:
    return (int(v), "") if v.isdigit() else (-1, v)


# A request for a known model no worker serves forces a fresh look at the registry, but
# not more often than this (s): a flood of such requests is one query per period.
FORCED_REFRESH_MIN_S = 0.25


class ModelCatalog:
    def __init__(
        self, specs: dict[str, dict[str, ModelSpec]], engine: AsyncEngine, *, refresh_s: float = 2.0
    ):
        self.specs = specs
        self.engine = engine
        self.refresh_s = refresh_s
        self._live: dict[tuple[str, str], bool] = {}
        self._fetched_at = float("-inf")  # monotonic; the first call fetches
        self._lock = asyncio.Lock()

    async def refresh(self, force: bool = False) -> None:
        period = FORCED_REFRESH_MIN_S if force else self.refresh_s
        if time.monotonic() - self._fetched_at < period:
            return
        async with self._lock:
            if time.monotonic() - self._fetched_at < period:
                return
            try:
                async with self.engine.connect() as conn:
                    rows = (await conn.execute(live_stmt())).all()
            except Exception as exc:  # keep the last known state while PostgreSQL is away
                log.warning("model registry refresh failed: %s", type(exc).__name__)
                self._fetched_at = time.monotonic()  # and do not ask again at once
                return
            self._live = {(r.name, r.version): bool(r.live) for r in rows}
            self._fetched_at = time.monotonic()

    def listing(self) -> list[dict[str, object]]:
        out = []
        for name, versions in sorted(self.specs.items()):
            for version, spec in sorted(versions.items()):
                out.append(
                    {
                        "model": name,
                        "version": version,
                        "max_batch_size": spec.max_batch_size,
                        "live": self._live.get((name, version), False),
                        "params": {p.name: p.default for p in spec.params},
                    }
                )
        return out

    async def resolve(self, ref: str) -> ModelSpec:
        """``name`` (latest live version) or ``name@version``."""
        await self.refresh()
        name, _, version = ref.partition("@")
        versions = self.specs.get(name)
        if not versions or (version and version not in versions):
            known = ", ".join(sorted(self.specs))
            raise NotFound(f"unknown model {shown(ref)} (available: {known})", field="model")
        if version:
            spec = versions[version]
        else:
            live = [v for v in versions if self._live.get((name, v))]
            spec = versions[max(live, key=_version_order)] if live else latest(versions)
        if not self._live.get((spec.name, spec.version)):
            await self.refresh(force=True)
            if not self._live.get((spec.name, spec.version)):
                raise Unavailable(
                    f"no worker is serving model {spec.ref} right now",
                    retry_after_s=5,
                    reason="no_live_worker",
                )
        return spec
