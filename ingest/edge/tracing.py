"""The API's spans: one per request a model serves (``span_name``), continuing the
caller's W3C trace, with the OpenTelemetry GenAI conventions' attributes
(``genai_attributes``: ``gen_ai.operation.name``, ``gen_ai.request.model``,
``gen_ai.usage.input_tokens`` ...) beside Gristmill's own, so a tracing backend that knows
vLLM's spans reads ours (decision 55).

``traced`` wraps the ASGI app only when tracing is on (core/tracing.py); off, it
returns the app unchanged and the request path holds no tracing code at all but
``annotate`` and ``core.tracing.headers``, each a test of one flag.
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core import tracing
from core.config import ObservabilitySettings

# The routes that ask a model for something, each a span named by its template: a path
# parameter in the name would make every model a span name of its own.
_ROUTES = frozenset({"/v1/infer", "/v1/embeddings", "/v1/completions", "/v1/jobs", "/v1/batches"})
_KSERVE = {5: "/v2/models/{model}/infer", 7: "/v2/models/{model}/versions/{version}/infer"}
# The conventions' name for the one serving here (gen_ai.provider.name).
PROVIDER = "gristmill"


def span_name(method: str, path: str) -> str | None:
    """The span's name for a request, or None where it gets no span of its own."""
    if method != "POST":
        return None
    if path in _ROUTES:
        return f"POST {path}"
    parts = path.split("/")
    if path.startswith("/v2/models/") and parts[-1] == "infer":
        template = _KSERVE.get(len(parts))
        if template is not None and (len(parts) == 5 or parts[4] == "versions"):
            return f"POST {template}"
    return None


def genai_attributes(
    *,
    operation: str,
    requested: str,
    served: str,
    input_tokens: int | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
) -> dict[str, Any]:
    """The GenAI semantic conventions' attributes of one request: the operation
    ("embeddings", "text_completion", or Gristmill's own "infer"), the model as asked and
    the version that serves it, and the token counts known when it is accepted."""
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.request.model": requested,
        "gen_ai.response.model": served,
    }
    if input_tokens is not None:
        attrs["gen_ai.usage.input_tokens"] = input_tokens
    if max_tokens is not None:
        attrs["gen_ai.request.max_tokens"] = max_tokens
    if temperature is not None:
        attrs["gen_ai.request.temperature"] = float(temperature)
    return attrs


def traced(app: ASGIApp, settings: ObservabilitySettings) -> ASGIApp:
    if not tracing.setup(settings, "gristmill-api"):
        return app
    return _Traced(app)


class _Traced:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = span_name(scope["method"], scope["path"]) if scope["type"] == "http" else None
        if name is None:
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
            name, context=parent, kind=SpanKind.SERVER
        ) as span:
            await self.app(scope, receive, send_status)
            span.set_attribute("http.response.status_code", status[0])
            if status[0] >= 500:
                span.set_status(StatusCode.ERROR)


def annotate(request_id: str, model: str, tier: str, genai: dict[str, Any] | None = None) -> None:
    """Name the request on its span, to find its trace by id, with its GenAI attributes
    (nothing while off)."""
    if not tracing.enabled():
        return
    from opentelemetry import trace

    trace.get_current_span().set_attributes(
        {
            "gristmill.request_id": request_id,
            "gristmill.model": model,
            "gristmill.tier": tier,
            **(genai or {}),
        }
    )
