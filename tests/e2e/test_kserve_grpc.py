"""KServe's open inference protocol over gRPC, driven by ``tritonclient.grpc``
unmodified against a real system (Kafka, PostgreSQL, two API processes sharing the
gRPC port): health, metadata, infer (BYTES in; FP32 or BYTES out, read with as_numpy)
on the same durable path as HTTP, and a hostile caller's requests refused with the
right gRPC status, never INTERNAL."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import orjson
import psutil
import pytest
import tritonclient.grpc as tg
from sqlalchemy import Text, cast, func, literal, select
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from gristmill.devservices import free_port
from gristmill.devservices.stack import System
from results.db import make_engine
from results.schema import requests
from results.tenants import create_tenant, issue_key, set_plan
from tests.e2e.waits import eventually

MODEL = "all-minilm-l6-v2"
DIM = 384


def listeners(port: int) -> set[int]:
    """The processes listening on ``port``."""
    return {
        x.pid
        for x in psutil.net_connections("tcp")
        if x.laddr and x.laddr.port == port and x.status == psutil.CONN_LISTEN and x.pid
    }


@pytest.fixture(scope="module")
def grpc_url(system: System) -> Iterator[str]:
    """An API of two processes serving gRPC on one port (SO_REUSEPORT), started as a
    deployment starts it (``gristmill api``, its settings from the environment)."""
    port = free_port()
    system.start_api("api-grpc", env={"GRISTMILL_GRPC_PORT": str(port)}, processes=2, cli=True)
    system.wait_until_serving(MODEL, timeout_s=300)
    # Each of the two processes listens on the port itself.
    c = tg.InferenceServerClient(f"127.0.0.1:{port}")
    assert c.is_server_live()
    c.close()
    # Serving means one process answered; the other may still be in its start-up.
    listening = eventually(lambda: listeners(port), lambda pids: len(pids) == 2, timeout_s=60)
    assert len(listening) == 2, listening
    yield f"127.0.0.1:{port}"
    system.stop("api-grpc")


@pytest.fixture(scope="module")
def client(grpc_url: str) -> Iterator[tg.InferenceServerClient]:
    c = tg.InferenceServerClient(grpc_url)
    yield c
    c.close()


def auth(system: System, tier: str = "paid") -> dict[str, str]:
    # gRPC metadata names are lower case (grpc refuses others).
    return {"authorization": f"Bearer {system.keys[tier]}"}


def texts_input(texts: list[bytes]) -> tg.InferInput:
    t = tg.InferInput("text", [len(texts)], "BYTES")
    t.set_data_from_numpy(np.array(texts, dtype=np.object_))
    return t


def refused(call: object) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as e:
        call()  # type: ignore[operator]
    return e.value


def test_health_and_metadata(client: tg.InferenceServerClient, system: System) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert "binary_tensor_data" in client.get_server_metadata().extensions
    assert client.is_model_ready(MODEL) and client.is_model_ready("sim", "1")
    assert not client.is_model_ready("no-such-model")
    meta = client.get_model_metadata(MODEL, as_json=True)
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": ["-1"]}]
    assert meta["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": ["-1", str(DIM)]}]
    assert client.get_model_metadata(MODEL, "1", headers=auth(system)).versions == ["1"]
    e = refused(lambda: client.get_model_metadata("no-such-model"))
    assert e.status() == "StatusCode.NOT_FOUND" and "no-such-model" in e.message()


def test_fp32_answer_is_the_http_answer(client: tg.InferenceServerClient, system: System) -> None:
    texts = ["the first text", "the second one"]
    r = client.infer(
        MODEL,
        [texts_input([t.encode() for t in texts])],
        outputs=[tg.InferRequestedOutput("embedding")],
        headers=auth(system),
        request_id="mine",
    )
    emb = r.as_numpy("embedding")
    assert emb.dtype == np.float32 and emb.shape == (2, DIM)
    assert r.get_response().id == "mine" and r.get_response().model_version == "1"
    for row, t in zip(emb, texts, strict=True):
        h = httpx.post(
            f"{system.url}/v1/infer",
            json={"model": MODEL, "input": t},
            headers=system.headers(),
            timeout=30,
        )
        assert row.tolist() == pytest.approx(h.json()["output"], abs=1e-6)


def _stored(system: System, text: str) -> list[tuple[str, str]]:
    with make_engine(system.settings.database_url).connect() as conn:
        rows = conn.execute(
            select(requests.c.tenant_id, requests.c.priority).where(
                requests.c.input == func.to_jsonb(cast(literal(text), Text))
            )
        ).all()
    return [(str(r.tenant_id), r.priority) for r in rows]


def test_bytes_answer_is_durable_and_tiered(
    client: tg.InferenceServerClient, system: System
) -> None:
    text = f"grpc {uuid.uuid4().hex}"
    r = client.infer(
        "sim", [texts_input([text.encode()])], headers=auth(system, "enterprise"), priority=3
    )
    out = r.as_numpy("output")
    assert out.shape == (1,) and orjson.loads(out[0]) is not None
    # Written to the request log by the worker, as the enterprise tenant's, in the tier
    # priority 3 lowered it to.
    assert _stored(system, text) == [(system.tenant_ids["enterprise"], "free")]


def test_idempotency_key_is_one_request_per_tenant(
    client: tg.InferenceServerClient, system: System
) -> None:
    key, text = uuid.uuid4().hex, f"once {uuid.uuid4().hex}"
    headers = {**auth(system), "idempotency-key": key}
    first = client.infer("sim", [texts_input([text.encode()])], headers=headers)
    again = client.infer("sim", [texts_input([text.encode()])], headers=headers)
    # The replay is the stored row (jsonb: its keys in PostgreSQL's order).
    assert orjson.loads(first.as_numpy("output")[0]) == orjson.loads(again.as_numpy("output")[0])
    assert _stored(system, text) == [(system.tenant_ids["paid"], "paid")]
    # Another tenant's same key names its own request, never the first tenant's rows.
    other = f"theirs {uuid.uuid4().hex}"
    theirs = {**auth(system, "free"), "idempotency-key": key}
    client.infer("sim", [texts_input([other.encode()])], headers=theirs)
    assert _stored(system, other) == [(system.tenant_ids["free"], "free")]
    # The same key with another body is the caller's mistake.
    e = refused(lambda: client.infer("sim", [texts_input([b"different"])], headers=headers))
    assert e.status() == "StatusCode.INVALID_ARGUMENT"


def test_a_hostile_caller_gets_statuses_naming_the_problem(
    client: tg.InferenceServerClient, system: System
) -> None:
    ok = [texts_input([b"x"])]
    e = refused(lambda: client.infer("sim", ok))
    assert e.status() == "StatusCode.UNAUTHENTICATED" and "Authorization" in e.message()
    e = refused(lambda: client.infer("sim", ok, headers={"authorization": "Bearer gm_nope"}))
    assert e.status() == "StatusCode.UNAUTHENTICATED"
    e = refused(lambda: client.infer("no-such-model", ok, headers=auth(system)))
    assert e.status() == "StatusCode.NOT_FOUND"
    e = refused(lambda: client.infer("sim", [texts_input([b"a\x00b"])], headers=auth(system)))
    assert e.status() == "StatusCode.INVALID_ARGUMENT" and "inputs[0].data[0]" in e.message()
    e = refused(lambda: client.infer("sim", [texts_input([b"\xff\xfe"])], headers=auth(system)))
    assert e.status() == "StatusCode.INVALID_ARGUMENT" and "UTF-8" in e.message()
    fp32 = tg.InferInput("text", [2], "FP32")
    fp32.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
    e = refused(lambda: client.infer("sim", [fp32], headers=auth(system)))
    assert e.status() == "StatusCode.INVALID_ARGUMENT" and "BYTES" in e.message()
    wrong = tg.InferInput("INPUT0", [1], "BYTES")
    wrong.set_data_from_numpy(np.array([b"x"], dtype=np.object_))
    e = refused(lambda: client.infer("sim", [wrong], headers=auth(system)))
    assert e.status() == "StatusCode.INVALID_ARGUMENT" and "'text'" in e.message()
    e = refused(
        lambda: client.infer(
            "sim", ok, outputs=[tg.InferRequestedOutput("logits")], headers=auth(system)
        )
    )
    assert e.status() == "StatusCode.INVALID_ARGUMENT" and "logits" in e.message()
    # Larger than the HTTP body limit: gRPC's own refusal, before any of it is parsed.
    big = [texts_input([b"x" * (system.settings.max_body_bytes + 10)])]
    e = refused(lambda: client.infer("sim", big, headers=auth(system)))
    assert e.status() == "StatusCode.RESOURCE_EXHAUSTED"


def test_a_timeout_no_batch_can_meet_is_invalid_argument_naming_the_minimum(
    client: tg.InferenceServerClient, system: System
) -> None:
    """Triton's ``timeout`` (us) below what a batch of one takes is the caller's mistake
    (decision 62): INVALID_ARGUMENT naming timeout_ms and the minimum, not UNAVAILABLE."""
    ok = [texts_input([b"x"])]
    e = refused(lambda: client.infer("sim", ok, headers=auth(system), timeout=1000))
    assert e.status() == "StatusCode.INVALID_ARGUMENT", e.message()
    assert "timeout_ms" in e.message() and "parameters.timeout" in e.message()
    m = re.search(r"minimum of (\d+) ms", e.message())
    assert m is not None and int(m.group(1)) >= 100 + system.settings.deadline_margin_ms


def test_a_message_tritonclient_would_not_build(grpc_url: str, system: System) -> None:
    """Shape and data that disagree, sent with the generated stub itself."""
    with grpc.insecure_channel(grpc_url) as channel:
        stub = tg.service_pb2_grpc.GRPCInferenceServiceStub(channel)
        m = pb.ModelInferRequest(model_name="sim")
        t = m.inputs.add(name="text", datatype="BYTES", shape=[3])
        t.contents.bytes_contents.extend([b"a", b"b"])
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(m, metadata=tuple(auth(system).items()))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "shape says 3 elements, the data holds 2" in (e.value.details() or "")
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(
                pb.ModelInferRequest(model_name="sim"), metadata=tuple(auth(system).items())
            )
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_over_its_rate_a_tenant_gets_resource_exhausted_with_retry_info(
    grpc_url: str, system: System
) -> None:
    name = f"slow-{uuid.uuid4().hex[:8]}"
    with make_engine(system.settings.database_url).begin() as conn:
        tenant = create_tenant(conn, name, "free")
        set_plan(conn, name, rate_rps=0.1, burst=1, job_items_per_s=1)
        key = issue_key(conn, tenant)[1]
    with grpc.insecure_channel(grpc_url) as channel:
        stub = tg.service_pb2_grpc.GRPCInferenceServiceStub(channel)
        m = pb.ModelInferRequest(model_name="sim")
        t = m.inputs.add(name="text", datatype="BYTES", shape=[2])
        t.contents.bytes_contents.extend([b"one", b"two"])
        meta = (("authorization", f"Bearer {key}"),)
        # Two items against a burst of one: taken, leaving the bucket in debt (one
        # channel is one connection: the same API process both times).
        stub.ModelInfer(m, metadata=meta)
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(m, metadata=meta)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailing = dict(e.value.trailing_metadata() or ())
    assert int(trailing["retry-after"]) >= 1 and "grpc-retry-pushback-ms" in trailing
