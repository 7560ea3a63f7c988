"""The API's spans: one per ``POST /v1/infer``, continuing the caller's W3C trace.

``traced`` wraps the ASGI app only when tracing is on (core/tracing.py); off, it
returns the app unchanged and the request path holds no tracing code at all but
``annotate`` and ``core.tracing.headers``, each a test of one flag.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core import tracing
from core.config import ObservabilitySettings

PATH = "/v1/infer"


def traced(app: ASGIApp, settings: ObservabilitySettings) -> ASGIApp:
    if not tracing.setup(settings, "gristmill-api"):
        return app
    return _Traced(app)


class _Traced:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        from opentelemetry.trace import SpanKind, StatusCode

        carrier = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope["headers"]
            if k in (b"traceparent", b"tracestate")
        }
        parent = tracing.context_from(carrier) if carrier else None
        status = [0]

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        with tracing.tracer().start_as_current_span(
            f"POST {PATH}", context=parent, kind=SpanKind.SERVER
        ) as span:
            await self.app(scope, receive, send_status)
            span.set_attribute("http.response.status_code", status[0])
            if status[0] >= 500:
                span.set_status(StatusCode.ERROR)


def annotate(request_id: str, model: str, tier: str) -> None:
    """Name the request on its span, to find its trace by id (nothing while off)."""
    if not tracing.enabled():
        return
    from opentelemetry import trace

    trace.get_current_span().set_attributes(
        {"gristmill.request_id": request_id, "gristmill.model": model, "gristmill.tier": tier}
    )
