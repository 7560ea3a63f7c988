"""Peer (a): a plain FastAPI service that calls ``sim`` once per request, no batching.

Run as ``uvicorn bench.peers.plain_app:app --workers 2``: two processes, each holding one
model instance behind a one-slot semaphore, i.e. two model calls in flight at most, the
same accelerator budget as Gristmill's two workers. The call runs in a thread so the
event loop keeps accepting (and queueing) requests while the "accelerator" is busy.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from fastapi import FastAPI
from fastapi.responses import ORJSONResponse
from pydantic import BaseModel

from bench.peers.stats import STATS_DIR_ENV, BusyMeter
from core.models.sim import SimSpec
from workers.models.sim import SimModel

SPEC = SimSpec(
    name="sim",
    version="1",
    max_batch_size=100,
    batch_ms=float(os.environ.get("GRISTMILL_SIM_BATCH_MS", "100")),
)
app = FastAPI()
_model = SimModel(SPEC)
_meter = BusyMeter(os.environ.get(STATS_DIR_ENV))
_slot: asyncio.Semaphore | None = None  # created in the serving loop


class Body(BaseModel):
    model: str
    input: str
    params: dict[str, Any] | None = None


@app.post("/v1/infer")
async def infer(body: Body) -> ORJSONResponse:
    global _slot
    if _slot is None:
        _slot = asyncio.Semaphore(1)
    SPEC.validate_input(body.input)
    async with _slot:
        t0 = time.perf_counter()
        out = await asyncio.to_thread(_model.predict, [body.input], body.params or {})
        _meter.record(1, time.perf_counter() - t0)
    return ORJSONResponse({"output": out[0], "model": "sim", "batch_size": 1})


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}
