"""``POST /v1/infer`` (and OpenAI's ``POST /v1/embeddings``) served straight from
uvicorn, in front of FastAPI.

The sync endpoint is the hot path. At 1,000 requests/s FastAPI's layers around it
(middleware stack, routing, dependency solving for two headers) were a fifth of the
API's CPU, about as much as the endpoint's own work (docs/bench/profile.md). This
wrapper serves that one route through the same door the FastAPI route uses (``INFER``
on the acceptance pipeline), the same key check as the gate (``authenticate_scope``),
the same body limits and the same error mapping (ingest/edge/http.py); every other
request, and the lifespan, goes to FastAPI, which still documents the route in
OpenAPI. Decision 16 says why a route bypasses the framework.

Order, cheapest refusal first: the key (from the headers), the headers' own values,
then the body (capped in size and in time), then everything that reads it.
"""

from __future__ import annotations

import time

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from core.config import Settings
from ingest import metrics
from ingest.acceptance.pipeline import Call, Door, check_headers, serve
from ingest.acceptance.state import AppState
from ingest.edge.auth import authenticate_scope
from ingest.edge.error_shapes import shape_for
from ingest.edge.http import answer, capped, declared_too_large, timed, too_large
from ingest.native.routes import INFER
from ingest.openai.embeddings import EMBEDDINGS

PATH = "/v1/infer"
# OpenAI's embeddings route takes the same path: its clients' traffic is as hot.
DOORS: dict[str, Door] = {PATH: INFER, "/v1/embeddings": EMBEDDINGS}


class _Disconnected(Exception):
    """The client went away before its body arrived: nobody to answer."""


class InferFastPath:
    def __init__(self, app: FastAPI, settings: Settings):
        self.app = app
        self.max_body_bytes = settings.max_body_bytes
        self.body_timeout_s = settings.body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        door = DOORS.get(path)
        if scope["type"] != "http" or door is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        received = time.time()
        error: Exception | None = None
        try:
            state: AppState = self.app.state.gristmill
            # In front of the gate (FastAPI runs it): the fast path is its paths' gate.
            scope.setdefault("state", {})["received"] = received
            tenant = await authenticate_scope(state.auth, scope)  # before the body
            idempotency_key = None
            for name, value in scope["headers"]:
                if name == b"idempotency-key":
                    idempotency_key = value.decode("latin-1")
                    break
            check_headers(state.settings, idempotency_key)
            body = await self._body(scope, receive)
            call = Call(tenant, idempotency_key, body, received, scope["headers"])
            response = await serve(state, door, call)
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
