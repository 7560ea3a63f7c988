"""The application: FastAPI for every route, the /v1/infer fast path in front of it,
an error guard in front of both (``create_asgi``, what uvicorn serves)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Header, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import ORJSONResponse
from starlette.types import ASGIApp

from core import __version__
from core.config import Settings
from core.models.catalog import build_specs
from core.topics import ensure_topics
from ingest import (
    admin,
    completions,
    dashboard,
    infer,
    jobs,
    kserve,
    metrics,
    openai_batches,
    openai_compat,
)
from ingest.auth import Authenticator, AuthGate
from ingest.catalog import ModelCatalog
from ingest.db_health import DatabaseHealth
from ingest.fast_path import InferFastPath
from ingest.http import BodyLimit, ErrorGuard, install_error_handlers
from ingest.job_limits import catalog_reader
from ingest.job_pacing import Pacer, target_lag_ms
from ingest.job_submit import JobPublisher
from ingest.load_watch import LoadWatch
from ingest.openai_wire import models_answer
from ingest.overload import Overload
from ingest.producer import AsyncProducer
from ingest.ratelimit import InflightLimiter, TenantLimiter
from ingest.readiness import Readiness
from ingest.refusal_log import RefusalLog
from ingest.request_log_flush import flush_loop, flush_once
from ingest.schemas import ERROR_RESPONSES, infer_request_schema
from ingest.shared_slots import SharedSlots, slots_dir
from ingest.state import AppState, get_state
from ingest.tracing import traced
from ingest.waiters import ResultWaiter
from ingest.webhooks import webhook_loop
from results.db import make_async_engine
from results.durability import refusal

log = logging.getLogger("gristmill.ingest")

# How long a thread may hold the interpreter lock while the event loop waits for it (s;
# Python's default is 5 ms).
GIL_SWITCH_S = 0.0005

# Routes a caller may read without a key (shown the live versions only).
CATALOG_PATHS = frozenset(
    {
        "/v1/models",
        "/v2/models/{model}",
        "/v2/models/{model}/versions/{version}",
        "/v2/models/{model}/ready",
        "/v2/models/{model}/versions/{version}/ready",
    }
)


async def finish_stale_submissions(state: AppState, interval_s: float = 5.0) -> None:
    """Finish phase 2 of job submissions whose API instance died mid-way."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            job_id = await state.jobs.claim_stale()
            if job_id is not None:
                log.warning("finishing the submission of job %s left by another instance", job_id)
                await state.jobs.publish(job_id)
        except Exception as exc:  # Kafka or PostgreSQL away: the next pass retries
            log.warning("stale submission pass failed: %s", exc)


async def check_durability_at_start(settings: Settings) -> None:
    """Outside development, refuse to start on Kafka or PostgreSQL settings that could
    lose what this API acknowledges (decision 20), naming each setting; services that
    cannot be reached to check are a refusal too (the process manager starts it again)."""
    if settings.allow_weak_durability:
        log.warning("allow_weak_durability is set: Kafka and PostgreSQL durability unchecked")
        return
    try:
        why = await asyncio.to_thread(refusal, settings)
    except Exception as exc:
        why = f"refusing to start: cannot check Kafka and PostgreSQL durability ({exc})"
    if why is not None:
        log.error("%s", why)
        raise RuntimeError(why)


def create_app(settings: Settings) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            ensure_topics(settings, timeout_s=10)
        except Exception as exc:  # the API still starts; produce answers 503 until Kafka is back
            log.warning("could not check Kafka topics: %s", exc)
        await check_durability_at_start(settings)
        # The event loop waits for the interpreter lock behind a job's intake threads;
        # hand it over sooner (as the scheduler does, scheduler/runtime/service.py).
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
        engine = make_async_engine(settings.database_url)
        limiter = TenantLimiter()
        overload = Overload()
        waiter = ResultWaiter(
            engine, settings.database_url, poll_interval_s=settings.result_poll_interval_ms / 1000
        )
        shared = slots_dir()  # the instance's processes count their open work together
        state = AppState(
            settings=settings,
            engine=engine,
            producer=AsyncProducer(settings, timeout_ms=settings.produce_timeout_ms),
            auth=Authenticator(engine, settings),
            catalog=ModelCatalog(
                settings,
                engine,
                database_url=settings.database_url,
                deployment=settings.topic_prefix,
            ),
            waiter=waiter,
            jobs=JobPublisher(
                settings,
                Pacer(lambda: overload.lag.lag_ms, target_lag_ms(settings.loop_lag_shed_ms)),
            ),
            limiter=limiter,
            inflight=InflightLimiter(settings.max_inflight, settings.inflight_share),
            load=LoadWatch(engine, settings, limiter),
            overload=overload,
            uploads=SharedSlots(
                shared,
                "uploads",
                total=settings.max_uploads,
                per_key=settings.max_uploads_per_tenant,
            ),
            follows=SharedSlots(
                shared,
                "follows",
                total=settings.max_follow_streams,
                per_key=settings.max_follow_streams_per_tenant,
            ),
            read_streams=SharedSlots(
                shared,
                "streams",
                total=settings.max_streams,
                per_key=min(settings.tier_max_streams.values()),
            ),
        )
        # Every sign of the database feeds one judgement (ingest/db_health.py): the
        # probe, the load watch's heartbeat commits, the result announcements heard.
        health = DatabaseHealth(stale_s=settings.load_report_stale_s)
        state.load.health = health
        state.catalog.health = health
        waiter.on_heard = health.heard
        readiness = Readiness(
            engine,
            refresh_s=settings.readyz_refresh_s,
            listening=waiter.listening.is_set,
            revocations=lambda: state.auth.listening,
            health=health,
        )
        app.state.gristmill = state
        app.state.readiness = readiness
        await waiter.start()
        await state.auth.start()
        background = [
            asyncio.create_task(readiness.run()),
            asyncio.create_task(webhook_loop(engine, settings)),
            asyncio.create_task(finish_stale_submissions(state)),
            asyncio.create_task(state.load.run()),
            asyncio.create_task(state.overload.lag.run()),
            asyncio.create_task(metrics.publish_loop(state)),
            asyncio.create_task(metrics.job_gauges_loop(state)),
            asyncio.create_task(flush_loop(engine)),  # refusal counts, answer timeouts
            asyncio.create_task(state.catalog.run()),
        ]
        try:
            yield
        finally:
            for task in background:
                task.cancel()
            with contextlib.suppress(Exception):  # the database may be the thing that is gone
                await state.load.leave()
            with contextlib.suppress(Exception):
                await flush_once(engine, everything=True)
            if state.streams is not None:
                await state.streams.stop()
            await waiter.stop()
            await state.auth.stop()
            state.producer.close()
            state.jobs.close()
            for slots in (state.uploads, state.follows, state.read_streams):
                slots.close()
            await engine.dispose()

    app = FastAPI(
        title="Gristmill",
        version=__version__,
        lifespan=lifespan,
        default_response_class=ORJSONResponse,
    )
    install_error_handlers(app)
    app.add_middleware(
        BodyLimit, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s
    )
    # Added last, so it runs first: a bad key is refused before anything reads the body.
    app.add_middleware(AuthGate)
    app.include_router(infer.router)
    app.include_router(completions.router)
    app.include_router(jobs.router, responses=ERROR_RESPONSES)
    app.include_router(openai_compat.router)
    app.include_router(openai_batches.router)
    app.include_router(kserve.router)
    app.include_router(metrics.router)
    app.include_router(admin.router, responses=ERROR_RESPONSES)
    app.include_router(dashboard.router)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"description": "not ready; the checks say why"}})
    async def readyz(request: Request) -> ORJSONResponse:
        # From the background check's cached state: a probe costs no database round trip.
        readiness: Readiness = request.app.state.readiness
        st = get_state(request)
        ok, checks = readiness.report(time.monotonic())
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

    @app.get("/v1/models", responses={s: ERROR_RESPONSES[s] for s in (401, 429, 500, 503)})
    async def list_models(
        request: Request, authorization: str | None = Header(default=None)
    ) -> dict[str, object]:
        # Gristmill's ``models`` and OpenAI's list (``object``, ``data``) in one body: with
        # a key every open version, without one the live versions only.
        st = get_state(request)
        tenant = await catalog_reader(st, authorization)
        await st.catalog.refresh()
        return models_answer(st.catalog.listing(every_version=tenant is not None))

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = api_schema(app, settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def api_schema(app: FastAPI, settings: Settings) -> dict[str, Any]:
    """The OpenAPI document: every route's errors in the one error shape, the key as a
    bearer scheme (not a header parameter each route declares), and /v1/infer's body
    with the caps in force (the route reads its body itself, ingest/fast_path.py)."""
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = schema.setdefault("components", {})
    components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, ops in schema.get("paths", {}).items():
        for op in ops.values():
            params = [
                p
                for p in op.get("parameters", [])
                if not (p.get("in") == "header" and p.get("name", "").lower() == "authorization")
            ]
            if params:
                op["parameters"] = params
            else:
                op.pop("parameters", None)
            if path in CATALOG_PATHS:
                op["security"] = [{"bearer": []}, {}]  # a key shows more; none is fine
            elif path.startswith("/v1/") or path.endswith("/infer"):
                op["security"] = [{"bearer": []}]
    # The built-in versions: those registered later are listed by GET /v1/models.
    specs = build_specs(settings)
    models = sorted([*specs, *(f"{name}@{v}" for name, vs in specs.items() for v in vs)])
    infer_op = schema["paths"]["/v1/infer"]["post"]
    infer_op["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": infer_request_schema(settings, models)}},
    }
    return schema


def create_asgi(settings: Settings) -> ASGIApp:
    """What uvicorn serves: the error guard, the log of refused requests, the trace span
    (when tracing is on), the /v1/infer fast path, then FastAPI."""
    return ErrorGuard(RefusalLog(traced(InferFastPath(create_app(settings), settings), settings)))
