"""The FastAPI application factory."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import ORJSONResponse
from sqlalchemy import text

from core import __version__
from core.config import Settings
from core.models.catalog import build_specs
from core.topics import ensure_topics
from ingest import infer, jobs, metrics
from ingest.auth import Authenticator
from ingest.catalog import ModelCatalog
from ingest.http import BodyLimit, install_error_handlers
from ingest.job_submit import JobPublisher
from ingest.load_watch import LoadWatch
from ingest.overload import Overload
from ingest.producer import AsyncProducer
from ingest.ratelimit import InflightLimiter, TenantLimiter
from ingest.state import AppState, get_state
from ingest.waiters import ResultWaiter
from ingest.webhooks import webhook_loop
from results.db import make_async_engine

log = logging.getLogger("gristmill.ingest")


async def finish_stale_submissions(state: AppState, interval_s: float = 5.0) -> None:
    """Finish phase 2 of job submissions whose API instance died mid-way."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            job_id = await asyncio.to_thread(state.jobs.claim_stale)
            if job_id is not None:
                log.warning("finishing the submission of job %s left by another instance", job_id)
                await asyncio.to_thread(state.jobs.publish, job_id)
        except Exception as exc:  # Kafka or PostgreSQL away: the next pass retries
            log.warning("stale submission pass failed: %s", exc)


def create_app(settings: Settings) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            ensure_topics(settings, timeout_s=10)
        except Exception as exc:  # the API still starts; produce answers 503 until Kafka is back
            log.warning("could not check Kafka topics: %s", exc)
        engine = make_async_engine(settings.database_url)
        limiter = TenantLimiter()
        waiter = ResultWaiter(
            engine, settings.database_url, poll_interval_s=settings.result_poll_interval_ms / 1000
        )
        state = AppState(
            settings=settings,
            engine=engine,
            producer=AsyncProducer(settings, timeout_ms=settings.produce_timeout_ms),
            auth=Authenticator(engine, ttl_s=settings.auth_cache_s),
            catalog=ModelCatalog(build_specs(settings), engine),
            waiter=waiter,
            jobs=JobPublisher(settings),
            limiter=limiter,
            inflight=InflightLimiter(settings.max_inflight, settings.inflight_share),
            load=LoadWatch(engine, settings, limiter),
            overload=Overload(),
        )
        app.state.gristmill = state
        await waiter.start()
        background = [
            asyncio.create_task(webhook_loop(engine, settings)),
            asyncio.create_task(finish_stale_submissions(state)),
            asyncio.create_task(state.load.run()),
            asyncio.create_task(state.overload.lag.run()),
            asyncio.create_task(metrics.publish_loop(state)),
        ]
        try:
            yield
        finally:
            for task in background:
                task.cancel()
            with contextlib.suppress(Exception):  # the database may be the thing that is gone
                await state.load.leave()
            await waiter.stop()
            state.producer.close()
            state.jobs.close()
            await engine.dispose()

    app = FastAPI(
        title="Gristmill",
        version=__version__,
        lifespan=lifespan,
        default_response_class=ORJSONResponse,
    )
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.include_router(infer.router)
    app.include_router(jobs.router)
    app.include_router(metrics.router)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request) -> ORJSONResponse:
        st = get_state(request)
        checks = {"listener": st.waiter.listening.is_set()}
        try:
            async with st.engine.connect() as conn:
                await conn.execute(text("select 1"))
            checks["database"] = True
        except Exception:
            checks["database"] = False
        ok = all(checks.values())
        return ORJSONResponse(
            # The lag this instance sheds on (decision 15): an operator's first look at
            # whether the instance itself is saturated.
            {
                "ready": ok,
                "checks": checks,
                "loop_lag_ms": round(st.overload.lag.lag_ms, 1),
                "answer_delay_ms": round(st.overload.answer.ms(), 1),
            },
            status_code=200 if ok else 503,
        )

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict[str, object]:
        st = get_state(request)
        await st.catalog.refresh()
        return {"models": st.catalog.listing()}

    return app
