"""KServe's open inference protocol over gRPC (decision 57): ``GRPCInferenceService``
(the servicer ``tritonclient.grpc`` ships) on the acceptance pipeline of the HTTP door,
in each API process, on the event loop uvicorn runs (grpc.aio), on
``GRISTMILL_GRPC_PORT``: every process binds it with SO_REUSEPORT, so ``gristmill api
--workers N`` serves it from N processes as it serves HTTP.

Health and metadata answer as over HTTP (public, more with a key); ModelInfer takes the
same API key, from the ``authorization: Bearer <key>`` metadata (what tritonclient sends
for ``headers=``), and an ``idempotency-key`` entry as HTTP's Idempotency-Key header.
Errors are gRPC statuses (grpc_wire.grpc_status): a client's mistake never INTERNAL.
Messages are capped at the HTTP body limit (GRISTMILL_MAX_BODY_BYTES).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from core.config import Settings
from core.errors import InvalidInput, NotFound, Unavailable
from ingest.acceptance import pipeline
from ingest.acceptance.pipeline import Call, Headers, Order, Outcome
from ingest.acceptance.state import AppState
from ingest.edge.http import bug_reference, known_error
from ingest.edge.refusal_counts import note_refusal
from ingest.kserve import answers
from ingest.kserve.grpc_wire import (
    grpc_status,
    infer_response,
    metadata_response,
    parse_model_infer,
)

log = logging.getLogger(__name__)
S = TypeVar("S")
Req = TypeVar("Req")
Resp = TypeVar("Resp")
# A servicer's RPC method: (self, request, context) -> its response.
Rpc = Callable[[S, Req, grpc.aio.ServicerContext], Awaitable[Resp]]
GRACE_S = 5.0  # for calls under way when the process stops (uvicorn drains HTTP first)


def _headers(context: grpc.aio.ServicerContext) -> Headers:
    """The call's metadata as headers (lower-case names, as ASGI's); binary entries
    (``-bin``) are no header of ours."""
    return [
        (k.encode("latin-1"), v.encode("latin-1"))
        for k, v in context.invocation_metadata() or ()
        if isinstance(v, str)
    ]


def _value(headers: Headers, name: bytes) -> str | None:
    for k, v in headers:
        if k == name:
            return v.decode("latin-1")
    return None


async def _refuse(context: grpc.aio.ServicerContext, exc: Exception, where: str) -> NoReturn:
    err = known_error(exc)
    if err is None:  # a bug: its stack logged under a reference, never its text sent
        ref = bug_reference(exc, f"gRPC {where}")
        await context.abort(
            grpc.StatusCode.INTERNAL, f"internal error; quote reference {ref} when reporting it"
        )
    else:
        note_refusal(err)
        code, message, trailing = grpc_status(err)
        await context.abort(code, message, trailing)
    raise AssertionError("context.abort raises")  # grpc is untyped: for the type checker


def _answered(rpc: Rpc[S, Req, Resp]) -> Rpc[S, Req, Resp]:
    """The RPC method ``rpc`` with any error it raises answered as the call's status."""

    @functools.wraps(rpc)
    async def answered(self: S, request: Req, context: grpc.aio.ServicerContext) -> Resp:
        try:
            return await rpc(self, request, context)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await _refuse(context, exc, rpc.__name__)
            raise  # not reached: _refuse raises

    return answered


def _model(name: str) -> str:
    if not name:
        raise InvalidInput("model_name is required", field="model_name")
    return name


def _target(request: Any, context: grpc.aio.ServicerContext) -> tuple[str | None, str, str | None]:
    """The caller's Authorization and the model version a metadata or readiness call names."""
    return (
        _value(_headers(context), b"authorization"),
        _model(request.name),
        request.version or None,
    )


class GrpcInferDoor:
    """ModelInfer's door on the pipeline: one per call, holding its message."""

    holds_slot = True
    __slots__ = ("deadline_ms", "limit_headers", "request")

    def __init__(self, request: pb.ModelInferRequest, deadline_ms: float | None):
        self.request = request
        self.deadline_ms = deadline_ms
        self.limit_headers: dict[str, str] = {}

    async def order(self, st: AppState, call: Call) -> Order:
        req = parse_model_infer(self.request, st.settings, self.deadline_ms)
        return await answers.infer_order(st, call, req)

    def answer(
        self, st: AppState, call: Call, order: Order, outcome: Outcome
    ) -> pb.ModelInferResponse:
        self.limit_headers = outcome.limit_headers
        spec, vectors, outputs = answers.infer_rows(order, outcome)
        return infer_response(
            order.wire, model=spec.name, version=spec.version, vectors=vectors, outputs=outputs
        )


class KServeGrpc(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, st: AppState):
        self.st = st

    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        ok, _ = self.st.readiness.report(time.monotonic())
        return pb.ServerReadyResponse(ready=ok)

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        meta = answers.server_metadata()
        return pb.ServerMetadataResponse(
            name=meta["name"], version=meta["version"], extensions=meta["extensions"]
        )

    @_answered
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        authorization, model, version = _target(request, context)
        return metadata_response(await answers.metadata_of(self.st, authorization, model, version))

    @_answered
    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        # Unknown, or no worker serves it now (HTTP's 404 and 503): not ready, as
        # Triton answers, so a client's readiness loop reads a bool, not an error.
        authorization, model, version = _target(request, context)
        try:
            await answers.ready_of(self.st, authorization, model, version)
        except (NotFound, Unavailable):
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    @_answered
    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        received = time.time()
        st, headers = self.st, _headers(context)
        tenant = await st.auth.authenticate(_value(headers, b"authorization"))
        key = _value(headers, b"idempotency-key")
        pipeline.check_headers(st.settings, key)
        left = context.time_remaining()
        path = {"model": _model(request.model_name), "version": request.model_version or None}
        door = GrpcInferDoor(request, None if left is None else left * 1000)
        answer = await pipeline.serve(st, door, Call(tenant, key, b"", received, headers, path))
        context.set_trailing_metadata(tuple((k.lower(), v) for k, v in door.limit_headers.items()))
        return answer


def server_options(settings: Settings) -> list[tuple[str, int]]:
    """A request is capped as over HTTP; several API processes share the port."""
    return [
        ("grpc.max_receive_message_length", settings.max_body_bytes),
        ("grpc.so_reuseport", 1),
    ]


def grpc_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@contextlib.asynccontextmanager
async def serving(settings: Settings, st: AppState) -> AsyncIterator[None]:
    """The gRPC service on ``settings.grpc_port`` while the API process runs."""
    server = grpc.aio.server(options=server_options(settings))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(KServeGrpc(st), server)
    address = grpc_address(settings.api_host, settings.grpc_port)
    server.add_insecure_port(address)  # TLS ends at the ingress, as for HTTP
    await server.start()
    log.info("KServe gRPC on %s", address)
    try:
        yield
    finally:
        await server.stop(GRACE_S)
