"""CPU per ``POST /v1/infer`` in the API process, through the fast path, in process.

Kafka and PostgreSQL are replaced by the smallest duck-typed stand-ins (a producer that
answers at once, a waiter), so what is measured is the API's own work: the key check,
the body, the door and the acceptance pipeline, the answer. The stand-ins are
duck-typed on purpose: the same file runs an older checkout too (before the pipeline,
ingest/ was flat), so a change is measured against its baseline on the same machine:

    PYTHONPATH=/path/to/baseline python bench/api_cpu.py 3000   # the baseline tree
    python bench/api_cpu.py 3000                                 # this tree

Requests go 50 at a time (concurrent callers); five rounds of N, CPU time per request
of each, and the collector's passes per 1,000 requests. ``FREEZE=1``: ``gc.freeze()``
after warm-up (start-up objects out of the collector's sight); ``GEN0=N``: N allocations
between young collections (the default is 700).
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import create_async_engine

from core.config import Settings
from core.messages import RequestMessage
from core.models.registry import builtin_records
from core.models.sim import sim_output
from results.tenants import Tenant, hash_key, new_key


class Waiter:
    channel = "gristmill_results_0123456789abcdef"  # this process's reply channel

    def __init__(self) -> None:
        self.listening = asyncio.Event()
        self.listening.set()
        self.waiting: dict[str, asyncio.Future[Any]] = {}

    def register(self, rid: str, received_at: float | None = None) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting[rid] = fut
        return fut

    def discard(self, rid: str) -> None:
        self.waiting.pop(rid, None)

    async def fetch(self, ids: list[str]) -> list[Any]:
        return []


class Producer:
    """Takes a message and has its answer stored at once."""

    def __init__(self, waiter: Waiter) -> None:
        self.waiter = waiter

    async def produce(self, topic: str, value: bytes, headers: Any = None) -> tuple[int, int]:
        msg = RequestMessage.decode(value)
        now = datetime.now(UTC)
        row = {
            "request_id": msg.request_id,
            "status": "succeeded",
            "output": sim_output(msg.input),
            "output_vector": None,
            "error": None,
            "model": msg.model,
            "model_version": msg.version,
            "batch_size": 8,
            **dict.fromkeys(("received_at", "consumed_at", "batched_at", "compute_start_at"), now),
            "compute_end_at": now,
            "persisted_at": now,
        }
        fut = self.waiter.waiting[msg.request_id]
        asyncio.get_running_loop().call_soon(lambda: fut.done() or fut.set_result(row))
        return 0, 0

    def close(self) -> None:
        pass


def _state(settings: Settings, tenant: Tenant, key: str) -> Any:
    """The API's state around the stand-ins, for whichever layout ingest/ has."""
    engine = create_async_engine("postgresql+psycopg://bench@127.0.0.1:9/bench")
    try:  # the rooms (decision 49)
        from ingest.acceptance.catalog import ModelCatalog
        from ingest.acceptance.idempotency import KeyClaims
        from ingest.acceptance.routing import RouteTable, Served
        from ingest.acceptance.state import AppState
        from ingest.admission.load_watch import LoadWatch
        from ingest.admission.overload import Overload
        from ingest.admission.ratelimit import InflightLimiter, TenantLimiter
        from ingest.admission.shared_slots import SharedSlots
        from ingest.edge.auth import Authenticator
        from ingest.edge.db_health import DatabaseHealth
        from ingest.edge.readiness import Readiness

        slots = Path(tempfile.mkdtemp(prefix="gm-apicpu-"))
        extra: dict[str, Any] = {
            "keys": KeyClaims(engine, ttl_h=24),
            "readiness": Readiness(
                engine,
                refresh_s=1,
                listening=bool,
                revocations=bool,
                health=DatabaseHealth(stale_s=float("inf")),
            ),
            **{
                name: SharedSlots(slots, name, total=1, per_key=1)
                for name in ("uploads", "follows", "read_streams")
            },
        }
    except ImportError:  # before: one flat folder
        from ingest.auth import Authenticator  # type: ignore[no-redef]
        from ingest.catalog import ModelCatalog  # type: ignore[no-redef]
        from ingest.load_watch import LoadWatch  # type: ignore[no-redef]
        from ingest.overload import Overload  # type: ignore[no-redef]
        from ingest.ratelimit import (  # type: ignore[no-redef]
            InflightLimiter,
            SlotLimiter,
            TenantLimiter,
        )
        from ingest.routing import RouteTable, Served  # type: ignore[no-redef]
        from ingest.state import AppState  # type: ignore[no-redef]

        extra = {"uploads": SlotLimiter(1, 1), "follows": SlotLimiter(1, 1)}
    auth = Authenticator(engine, settings)
    auth.found.put(key, (tenant, hash_key(key)), float("inf"))
    catalog = ModelCatalog(settings, engine)
    ready = {(r.name, r.version): Served(ready=1) for r in builtin_records(settings)}
    catalog.table = RouteTable(catalog.table.models, ready)
    catalog._fetched_at = float("inf")  # nothing to re-read
    waiter = Waiter()
    limiter = TenantLimiter()
    return AppState(
        settings=settings,
        engine=engine,
        producer=Producer(waiter),
        waiter=waiter,
        jobs=None,
        auth=auth,
        catalog=catalog,
        limiter=limiter,
        inflight=InflightLimiter(1_000_000, settings.inflight_share),
        flex_waits=InflightLimiter(settings.max_flex_waits, {}),
        load=LoadWatch(engine, settings, limiter),
        overload=Overload(),
        **extra,
    )


async def main(n: int) -> None:
    from ingest.app import create_app
    from ingest.fast_path import InferFastPath

    settings = Settings(allow_weak_durability=True)
    key = new_key()
    tenant = Tenant(
        id="00000000-0000-4000-8000-000000000001",
        name="bench",
        tier="enterprise",
        rate_rps=1e9,
        burst=1e9,
    )
    app = create_app(settings)
    app.state.gristmill = _state(settings, tenant, key)
    fast = InferFastPath(app, settings)
    headers = [(b"authorization", f"Bearer {key}".encode())]

    async def one(i: int) -> int:
        body = orjson.dumps({"model": "sim", "input": f"hello {i}"})
        scope = {"type": "http", "method": "POST", "path": "/v1/infer", "headers": headers}
        status, sent = [0], [False]

        async def receive() -> dict[str, Any]:
            if sent[0]:
                await asyncio.sleep(3600)
            sent[0] = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif status[0] != 200 and os.environ.get("DEBUG"):
                print(message.get("body", b"")[:300])

        await fast(scope, receive, send)
        return status[0]

    for i in range(500):  # warm-up
        assert await one(i) == 200
    if os.environ.get("FREEZE"):
        gc.collect()
        gc.freeze()
    if os.environ.get("GEN0"):  # a young-collection threshold to compare with the default
        gc.set_threshold(int(os.environ["GEN0"]), *gc.get_threshold()[1:])
    before = [s["collections"] for s in gc.get_stats()]
    rounds = []
    for _ in range(5):
        t0 = time.process_time()
        for j in range(0, n, 50):
            codes = await asyncio.gather(*(one(j + k) for k in range(50)))
            assert set(codes) == {200}, codes[:3]
        rounds.append((time.process_time() - t0) / n * 1e6)
    after = [s["collections"] for s in gc.get_stats()]
    passes = [round((b - a) / (5 * n) * 1000, 1) for a, b in zip(before, after, strict=True)]
    print(
        f"us of CPU a request: {[round(r, 1) for r in rounds]}, median "
        f"{sorted(rounds)[2]:.1f}; collector passes per 1,000 requests (gen 0, 1, 2): {passes}"
    )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000))
