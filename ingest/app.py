"""The application: FastAPI for every route, the /v1/infer fast path in front of it,
an error guard in front of both (``create_asgi``, what uvicorn serves)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Header, Request
from fastapi.openapi.utils import get_openapi
from starlette.types import ASGIApp

from core import __version__
from core.config import Settings
from core.models.catalog import build_specs
from ingest.acceptance.state import get_state
from ingest.edge.auth import AuthGate
from ingest.edge.error_shapes import ERROR_RESPONSES
from ingest.edge.http import BodyLimit, ErrorGuard, install_error_handlers
from ingest.edge.json_response import ORJSONResponse
from ingest.edge.refusal_log import RefusalLog
from ingest.edge.tracing import traced
from ingest.fast_path import InferFastPath
from ingest.jobs import routes as jobs
from ingest.jobs.limits import catalog_reader
from ingest.kserve import routes as kserve
from ingest.native import routes as native
from ingest.native.wire import infer_request_schema
from ingest.openai import batches, completions, embeddings, files
from ingest.openai.wire import models_answer
from ingest.operations import admin, dashboard
from ingest.operations import metrics as scrape
from ingest.services import Services, live_services

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


def create_app(settings: Settings, services: Services = live_services) -> FastAPI:
    """The FastAPI application around the state ``services`` makes and ends: the real
    Kafka and PostgreSQL by default, stand-ins in unit tests."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with services(settings) as state, contextlib.AsyncExitStack() as stack:
            app.state.gristmill = state
            if settings.grpc_port:
                # Imported only when on: the gRPC stubs are the optional extra ``grpc``.
                from ingest.kserve.grpc_service import serving

                await stack.enter_async_context(serving(settings, state))
            yield

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
    app.include_router(native.router)
    app.include_router(completions.router)
    app.include_router(jobs.router, responses=ERROR_RESPONSES)
    app.include_router(embeddings.router)
    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(kserve.router)
    app.include_router(scrape.router)
    app.include_router(admin.router, responses=ERROR_RESPONSES)
    app.include_router(dashboard.router)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"description": "not ready; the checks say why"}})
    async def readyz(request: Request) -> ORJSONResponse:
        # From the background check's cached state: a probe costs no database round trip.
        st = get_state(request)
        ok, checks = st.readiness.report(time.monotonic())
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


def create_asgi(settings: Settings, services: Services = live_services) -> ASGIApp:
    """What uvicorn serves: the error guard, the log of refused requests, the trace span
    (when tracing is on), the /v1/infer fast path, then FastAPI."""
    app = create_app(settings, services)
    return ErrorGuard(RefusalLog(traced(InferFastPath(app, settings), settings)))
