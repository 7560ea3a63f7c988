"""ingest/acceptance/catalog.py: once the registry has been read, a request never waits for the
next read (the background poll keeps the table current; a read that a slow database
holds up must not hold every request behind its lock; decision 39)."""

from __future__ import annotations

import asyncio

from core.config import Settings
from ingest.acceptance.catalog import ModelCatalog
from ingest.acceptance.routing import RouteTable, Served


def test_a_request_does_not_wait_for_a_due_refresh() -> None:
    async def run() -> None:
        catalog = ModelCatalog(Settings(), None)  # type: ignore[arg-type]  # never read here
        reads: list[bool] = []

        async def slow_read(force: bool = False) -> None:
            reads.append(force)
            await asyncio.sleep(30)  # a registry read stuck behind a stalled database

        catalog.refresh = slow_read  # type: ignore[method-assign]
        catalog._fetched_at = 0.0  # read once, long ago: a refresh is due
        t = catalog.table
        catalog.table = RouteTable(t.models, {("sim", "1"): Served(ready=2)})
        spec = await asyncio.wait_for(catalog.resolve("sim", tenant_id="t"), timeout=1)
        assert spec.ref == "sim@1"
        assert reads == []  # the poll refreshes, not the request

    asyncio.run(run())


def test_a_catalog_never_read_reads_first() -> None:
    async def run() -> None:
        catalog = ModelCatalog(Settings(), None)  # type: ignore[arg-type]
        reads: list[bool] = []

        async def read(force: bool = False) -> None:
            reads.append(force)
            t = catalog.table
            catalog.table = RouteTable(t.models, {("sim", "1"): Served(ready=1)})
            catalog._fetched_at = 1.0

        catalog.refresh = read  # type: ignore[method-assign]
        await catalog.resolve("sim", tenant_id="t")
        assert reads == [False]

    asyncio.run(run())
