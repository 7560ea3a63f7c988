"""``POST /v1/infer`` (and OpenAI's ``POST /v1/embeddings``) served straight from
uvicorn, in front of FastAPI.

The sync endpoint is the hot path. At 1,000 requests/s FastAPI's layers around it
(middleware stack, routing, dependency solving for two headers) were a fifth of the
API's CPU, about as much as the endpoint's own work (docs/bench/profile.md). This
wrapper serves that one route with the same handler the FastAPI route uses
(``answer_infer``), the same key check, the same body limits and the same error
mapping (ingest/edge/http.py); every other request, and the lifespan, goes to FastAPI,
which still documents the route in OpenAPI. Decision 16 says why a route bypasses
the framework.

Order, cheapest refusal first: the key (from the headers), the headers' own values,
then the body (capped in size and in time), then everything that reads it.
"""

from __future__ import annotations

import logging
import time

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from core.config import Settings
from ingest import metrics
from ingest.acceptance.state import AppState
from ingest.edge.error_shapes import shape_for
from ingest.edge.http import answer, capped, declared_too_large, timed, too_large
from ingest.native.routes import answer_infer, check_headers
from ingest.openai.embeddings import answer_embeddings
from ingest.openai.wire import parse_prefer

log = logging.getLogger("gristmill.ingest")

PATH = "/v1/infer"
# OpenAI's embeddings route takes the same path: its clients' traffic is as hot.
EMBEDDINGS = "/v1/embeddings"
PATHS = frozenset({PATH, EMBEDDINGS})


class _Disconnected(Exception):
    """The client went away before its body arrived: nobody to answer."""


class InferFastPath:
    def __init__(self, app: FastAPI, settings: Settings):
        self.app = app
        self.max_body_bytes = settings.max_body_bytes
        self.body_timeout_s = settings.body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path")
        if scope["type"] != "http" or path not in PATHS or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        received = time.time()
        error: Exception | None = None
        try:
            authorization = idempotency_key = None
            prefer: list[str] = []
            for name, value in scope["headers"]:
                if name == b"authorization":
                    authorization = value.decode("latin-1")
                elif name == b"idempotency-key":
                    idempotency_key = value.decode("latin-1")
                elif name == b"prefer":
                    prefer.append(value.decode("latin-1"))
            state: AppState = self.app.state.gristmill
            tenant = await state.auth.authenticate(authorization)  # before the body
            check_headers(state.settings, idempotency_key)
            body = await self._body(scope, receive)
            if path == PATH:
                response = await answer_infer(state, tenant, idempotency_key, body, received)
            else:
                response = await answer_embeddings(
                    state, tenant, idempotency_key, parse_prefer(prefer), body, received
                )
        except _Disconnected:
            return
        except Exception as exc:
            error = exc
            response = answer(exc, f"POST {path}", shape_for(path))
        if path == PATH:
            metrics.responded(response.status_code, error)
        await response(scope, receive, send)

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        if declared_too_large(scope, self.max_body_bytes):
            raise too_large(self.max_body_bytes)
        receive = timed(capped(receive, self.max_body_bytes), self.body_timeout_s)
        chunks: list[bytes] = []
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise _Disconnected
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
