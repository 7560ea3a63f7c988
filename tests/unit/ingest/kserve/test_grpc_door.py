"""ModelInfer's door through the whole API process (its lifespan starts the gRPC service
on loopback) on the in-memory stand-ins (tests/unit/ingest/stubs.py): each input produced
once before the answer, the deadline's DEADLINE_EXCEEDED naming where to fetch, a
retry's replay, no key no produce. The same path on real Kafka and PostgreSQL:
tests/e2e/test_kserve_grpc.py."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import orjson
import pytest
from starlette.testclient import TestClient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from core.config import Settings
from gristmill.devservices import free_port
from ingest.edge.refusal_counts import TIMEOUTS
from ingest.kserve.wire import decode_bytes_tensor
from tests.unit.ingest.stubs import Stubs, stub_app


@pytest.fixture
def door() -> Iterator[tuple[service_pb2_grpc.GRPCInferenceServiceStub, Stubs]]:
    port = free_port()
    app, stubs = stub_app(Settings(allow_weak_durability=True, grpc_port=port))
    with TestClient(app), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel), stubs


def request(*texts: str, timeout_us: int | None = None) -> pb.ModelInferRequest:
    m = pb.ModelInferRequest(model_name="sim", id="r")
    m.inputs.add(name="text", datatype="BYTES", shape=[len(texts)])
    m.inputs[0].contents.bytes_contents.extend(t.encode() for t in texts)
    if timeout_us is not None:
        m.parameters["timeout"].int64_param = timeout_us
    return m


def key(stubs: Stubs, **more: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {stubs.key}"), *more.items())


def test_each_input_is_produced_once_then_answered(
    door: tuple[service_pb2_grpc.GRPCInferenceServiceStub, Stubs],
) -> None:
    stub, stubs = door
    answer, call = stub.ModelInfer.with_call(request("a", "b"), metadata=key(stubs))
    assert [m.input for _, m in stubs.producer.sent] == ["a", "b"]
    assert all(m.tenant_id == stubs.tenant.id for _, m in stubs.producer.sent)
    assert answer.id == "r" and answer.outputs[0].name == "output"
    assert list(answer.outputs[0].shape) == [2] and len(answer.raw_output_contents) == 1
    # The tenant's rate headers, as over HTTP, in the trailing metadata.
    assert any(k.startswith("ratelimit") for k, _ in call.trailing_metadata())


def test_no_key_is_unauthenticated_and_nothing_is_produced(
    door: tuple[service_pb2_grpc.GRPCInferenceServiceStub, Stubs],
) -> None:
    stub, stubs = door
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(request("a"))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert not stubs.producer.sent


def test_no_answer_by_the_deadline_names_where_to_fetch_and_stays_accepted(
    door: tuple[service_pb2_grpc.GRPCInferenceServiceStub, Stubs],
) -> None:
    stub, stubs = door
    stubs.worker.hold = True
    TIMEOUTS.drain()
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(request("a", "b", timeout_us=30_000), metadata=key(stubs))
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "/v1/requests/" in (e.value.details() or "")
    assert len(stubs.producer.sent) == 2
    assert sorted(t.request_id for t in TIMEOUTS.drain()) == sorted(
        m.request_id for _, m in stubs.producer.sent
    )


def test_the_grpc_deadline_is_the_requests(
    door: tuple[service_pb2_grpc.GRPCInferenceServiceStub, Stubs],
) -> None:
    stub, stubs = door
    stub.ModelInfer(request("a"), metadata=key(stubs), timeout=20)
    ((_, m),) = stubs.producer.sent
    # What was left of the 20 s when the call arrived (a loaded machine may take a while
    # to connect), not the paid tier's 2 s SLO. gRPC reads what is left against the wall
    # clock, which a loaded VM's clock discipline moves by tens of ms (CI once read 20,049).
    assert 10_000 < (m.deadline - m.received_at) * 1000 <= 20_000 + 250


def test_a_retry_with_the_key_is_replayed_without_a_resend(
    door: tuple[service_pb2_grpc.GRPCInferenceServiceStub, Stubs],
) -> None:
    stub, stubs = door
    meta = key(stubs, **{"idempotency-key": "k-1"})
    first = stub.ModelInfer(request("a", "b"), metadata=meta)
    again = stub.ModelInfer(request("a", "b"), metadata=meta)
    assert len(stubs.producer.sent) == 2
    answers = [decode_bytes_tensor(x.raw_output_contents[0], "output") for x in (first, again)]
    assert len(answers[0]) == 2 and all(isinstance(orjson.loads(a), dict) for a in answers[0])
    assert [orjson.loads(a) for a in answers[0]] == [orjson.loads(a) for a in answers[1]]
    with pytest.raises(grpc.RpcError) as e:  # the same key, another body
        stub.ModelInfer(request("c"), metadata=meta)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(stubs.producer.sent) == 2
