"""The sync contract of every front door, through the whole API (gate, fast path,
FastAPI, the acceptance pipeline) on in-memory stand-ins (tests/unit/ingest/stubs.py):
admit, claim the Idempotency-Key, produce, wait, then 200 or 504, and a retry's replay.
The same paths run on real Kafka and PostgreSQL in tests/e2e."""

from __future__ import annotations

import dataclasses
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from core.models.sim import sim_output
from ingest.app import create_app
from ingest.edge.refusal_counts import TIMEOUTS
from tests.unit.ingest.stubs import Stubs, make_stubs, stub_services

EMBED = "all-minilm-l6-v2"
KSERVE_BODY = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}]}
# Each door: (path, a body of two inputs or one, the inputs it holds).
DOORS: list[tuple[str, dict[str, Any], list[str]]] = [
    ("/v1/infer", {"model": "sim", "input": "hello"}, ["hello"]),
    ("/v1/embeddings", {"model": EMBED, "input": ["a", "b"]}, ["a", "b"]),
    ("/v2/models/sim/infer", KSERVE_BODY, ["a", "b"]),
    ("/v1/completions", {"model": "gristmill-lm", "prompt": "hi", "max_tokens": 4}, ["hi"]),
]


def texts(stubs: Stubs) -> list[str]:
    out = []
    for _, m in stubs.producer.sent:
        out.append(m.input["text"] if isinstance(m.input, dict) else m.input)
    return out


@pytest.mark.parametrize(("path", "body", "inputs"), DOORS, ids=[d[0] for d in DOORS])
def test_every_door_produces_each_input_once_and_answers_200(
    api: tuple[TestClient, Stubs], path: str, body: dict[str, Any], inputs: list[str]
) -> None:
    client, stubs = api
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    assert texts(stubs) == inputs
    for topic, m in stubs.producer.sent:
        assert topic.endswith("requests.paid") and m.tenant_id == stubs.tenant.id
        assert m.priority == "paid" and m.deadline > m.received_at
    assert r.headers["RateLimit-Limit"]


@pytest.mark.parametrize(("path", "body", "inputs"), DOORS, ids=[d[0] for d in DOORS])
def test_every_door_refuses_a_missing_key_before_reading_the_body(
    api: tuple[TestClient, Stubs], path: str, body: dict[str, Any], inputs: list[str]
) -> None:
    client, stubs = api
    r = client.post(path, json=body, headers={"Authorization": ""})
    assert r.status_code == 401
    assert stubs.producer.sent == []


@pytest.mark.parametrize(("path", "body", "inputs"), DOORS, ids=[d[0] for d in DOORS])
def test_a_retry_with_the_key_is_answered_from_the_stored_rows_without_a_resend(
    api: tuple[TestClient, Stubs], path: str, body: dict[str, Any], inputs: list[str]
) -> None:
    client, stubs = api
    key = {"Idempotency-Key": f"k-{uuid.uuid4().hex}"}
    first = client.post(path, json=body, headers=key)
    sent = len(stubs.producer.sent)
    again = client.post(path, json=body, headers=key)
    assert first.status_code == again.status_code == 200
    assert len(stubs.producer.sent) == sent == len(inputs)
    if path == "/v1/infer":
        assert again.json()["request_id"] == first.json()["request_id"]
        assert again.json()["output"] == first.json()["output"]
    else:
        assert again.content.replace(b" ", b"")[:40] == first.content.replace(b" ", b"")[:40]


@pytest.mark.parametrize(("path", "body", "inputs"), DOORS, ids=[d[0] for d in DOORS])
def test_the_key_with_another_body_is_422(
    api: tuple[TestClient, Stubs], path: str, body: dict[str, Any], inputs: list[str]
) -> None:
    client, stubs = api
    key = {"Idempotency-Key": "same"}
    assert client.post(path, json=body, headers=key).status_code == 200
    other = orjson.loads(orjson.dumps(body).replace(b'"a"', b'"z"').replace(b'"h', b'"j'))
    r = client.post(path, json=other, headers=key)
    assert r.status_code == 422, r.text
    assert len(stubs.producer.sent) == len(inputs)


@pytest.mark.parametrize(("path", "body", "inputs"), DOORS[:3], ids=[d[0] for d in DOORS[:3]])
def test_no_answer_by_the_deadline_is_504_and_the_request_stays_accepted(
    api: tuple[TestClient, Stubs], path: str, body: dict[str, Any], inputs: list[str]
) -> None:
    client, stubs = api
    stubs.worker.hold = True
    TIMEOUTS.drain()
    timed = {**body, "timeout_ms": 30} if "model" in body else {**body, "parameters": {}}
    if path.startswith("/v2"):
        timed = {**body, "parameters": {"timeout_ms": 30}}
    r = client.post(path, json=timed)
    assert r.status_code == 504, r.text
    assert "/v1/requests/" in r.text
    assert len(stubs.producer.sent) == len(inputs)
    gave_up = sorted(t.request_id for t in TIMEOUTS.drain())
    assert gave_up == sorted(m.request_id for _, m in stubs.producer.sent)


def test_a_retry_while_the_first_attempt_runs_waits_for_it_without_a_resend(
    api: tuple[TestClient, Stubs],
) -> None:
    client, stubs = api
    stubs.worker.hold = True
    key = {"Idempotency-Key": "running"}
    body = {"model": "sim", "input": "slow", "timeout_ms": 5000}
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(client.post, "/v1/infer", json=body, headers=key)
        while not stubs.producer.sent:  # the first attempt is in Kafka
            time.sleep(0.005)
        retry = pool.submit(client.post, "/v1/infer", json=body, headers=key)
        time.sleep(0.05)  # the retry is waiting on the first attempt's row
        stubs.worker.hold = False
        stubs.worker.answer_in_loop(stubs.producer.sent[0][1])
        a, b = first.result(5), retry.result(5)
    assert a.status_code == b.status_code == 200
    assert a.json()["request_id"] == b.json()["request_id"]
    assert len(stubs.producer.sent) == 1


def test_a_retry_after_the_first_caller_gave_up_is_sent_again_under_its_id(
    api: tuple[TestClient, Stubs],
) -> None:
    client, stubs = api
    stubs.worker.hold = True
    key = {"Idempotency-Key": "inflight"}
    body = {"model": "sim", "input": "slow", "timeout_ms": 20}
    assert client.post("/v1/infer", json=body, headers=key).status_code == 504
    # The first caller gave up (its deadline passed): it may never have reached Kafka,
    # so the retry sends it again under the same request id.
    stubs.worker.hold = False
    r = client.post("/v1/infer", json=body, headers=key)
    assert r.status_code == 200
    ids = {m.request_id for _, m in stubs.producer.sent}
    assert len(stubs.producer.sent) == 2 and ids == {r.json()["request_id"]}
    first_at = stubs.producer.sent[0][1].received_at
    assert stubs.producer.sent[1][1].received_at == pytest.approx(first_at)


def test_a_retry_sent_again_goes_to_the_version_its_first_attempt_was_routed_to(
    api: tuple[TestClient, Stubs],
) -> None:
    # Decision 44: the claim keeps the version routing picked for the first attempt; a
    # retry that must be sent again goes there, pinned, whatever routing says now.
    client, stubs = api
    stubs.worker.hold = True
    key = {"Idempotency-Key": "rollout"}
    body = {"model": "sim", "input": "slow", "timeout_ms": 20}
    assert client.post("/v1/infer", json=body, headers=key).status_code == 504
    ((tenant_key, first),) = stubs.keys.claims.items()
    stubs.keys.claims[tenant_key] = dataclasses.replace(first, model_version="9")
    catalog = stubs.state.catalog
    resolve, asked = catalog.resolve, []

    async def pinned(ref: str, **kw: Any) -> Any:
        asked.append(ref)
        spec = await resolve("sim" if ref == "sim@9" else ref, **kw)
        return dataclasses.replace(spec, version="9") if ref == "sim@9" else spec

    catalog.resolve = pinned  # type: ignore[method-assign]
    stubs.worker.hold = False
    assert client.post("/v1/infer", json=body, headers=key).status_code == 200
    assert "sim@9" in asked
    (_, again) = stubs.producer.sent[1]
    assert (again.model, again.version) == ("sim", "9")
    assert stubs.producer.sent[0][1].version == "1"


def test_the_fingerprint_is_what_the_caller_sent_not_where_it_was_routed(
    api: tuple[TestClient, Stubs],
) -> None:
    client, _ = api
    key = {"Idempotency-Key": "named"}
    assert client.post("/v1/infer", json={"model": "sim", "input": "x"}, headers=key).is_success
    # The same version named another way is another body: the key names the first.
    r = client.post("/v1/infer", json={"model": "sim@1", "input": "x"}, headers=key)
    assert r.status_code == 422


def test_kafka_down_is_503_and_the_key_is_released_for_the_retry(
    api: tuple[TestClient, Stubs],
) -> None:
    client, stubs = api
    stubs.producer.down = True
    key = {"Idempotency-Key": "kafka-down"}
    body = {"model": "sim", "input": "x"}
    r = client.post("/v1/infer", json=body, headers=key)
    assert r.status_code == 503 and r.headers["Retry-After"]
    assert len(stubs.keys.released) == 1
    stubs.producer.down = False
    r = client.post("/v1/infer", json=body, headers=key)
    assert r.status_code == 200 and len(stubs.producer.sent) == 1


def test_no_listener_means_503_before_anything_is_produced(api: tuple[TestClient, Stubs]) -> None:
    client, stubs = api
    stubs.waiter.listening.clear()
    r = client.post("/v1/infer", json={"model": "sim", "input": "x"})
    assert r.status_code == 503 and stubs.producer.sent == []


def test_a_failed_input_is_422_naming_it(api: tuple[TestClient, Stubs]) -> None:
    client, stubs = api
    stubs.worker.fail.add("b")
    r = client.post("/v1/embeddings", json={"model": EMBED, "input": ["a", "b"]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "input[1]"


def test_infer_answers_the_output_and_its_timings(api: tuple[TestClient, Stubs]) -> None:
    client, stubs = api
    r = client.post("/v1/infer", json={"model": "sim", "input": "hello"})
    body = r.json()
    assert body["output"] == sim_output("hello") and body["model_version"] == "1"
    assert body["request_id"] == stubs.producer.sent[0][1].request_id
    assert body["timings"]["total_ms"] >= 0


def test_the_fastapi_route_answers_as_the_fast_path_does() -> None:
    """Without the fast path (decision 16) FastAPI's route serves /v1/infer, behind the
    gate, through the same door."""
    stubs = make_stubs()
    with TestClient(create_app(stubs.settings, stub_services(stubs))) as client:
        client.headers["Authorization"] = f"Bearer {stubs.key}"
        r = client.post("/v1/infer", json={"model": "sim", "input": "hello"})
        assert r.status_code == 200 and r.json()["output"] == sim_output("hello")
        assert client.post("/v1/infer", json={"model": "sim"}).status_code == 422
        r = client.post("/v1/infer", json={}, headers={"Authorization": ""})
        assert r.status_code == 401 and len(stubs.producer.sent) == 1


def test_embeddings_prefer_respond_async_answers_202_with_where_to_fetch(
    api: tuple[TestClient, Stubs],
) -> None:
    client, stubs = api
    stubs.worker.hold = True
    TIMEOUTS.drain()
    r = client.post(
        "/v1/embeddings",
        json={"model": EMBED, "input": ["a", "b"]},
        headers={"Prefer": "respond-async, wait=0"},
    )
    assert r.status_code == 202
    ids = [m.request_id for _, m in stubs.producer.sent]
    assert [d["request_id"] for d in r.json()["data"]] == ids
    assert r.headers["Location"] == f"/v1/requests/{ids[0]}"
    assert TIMEOUTS.drain() == []  # not a 504: nobody gave up


def test_a_stream_sends_every_token_in_order_then_the_end(api: tuple[TestClient, Stubs]) -> None:
    client, stubs = api
    body = {"model": "gristmill-lm", "prompt": "hi", "max_tokens": 4, "stream": True}
    r = client.post("/v1/completions", json={**body, "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in r.text.split("\n\n") if e]
    ids = [int(e.split("\n")[0][4:]) for e in events if e.startswith("id: ")]
    assert ids == [0, 1, 2, 3, 4]  # four tokens, then the end's chunk
    text = "".join(
        orjson.loads(e.split("data: ", 1)[1])["choices"][0]["text"]
        for e in events
        if e.startswith("id: ")
    )
    assert text == "Hello, world"
    assert '"total_tokens":6' in events[-2] and events[-1] == "data: [DONE]"
    assert stubs.waiter.streams_closed == 1


def test_a_retried_stream_resumes_after_the_last_event_it_got(
    api: tuple[TestClient, Stubs],
) -> None:
    client, stubs = api
    key = {"Idempotency-Key": "stream-1"}
    body = {"model": "gristmill-lm", "prompt": "hi", "max_tokens": 4, "stream": True}
    assert client.post("/v1/completions", json=body, headers=key).status_code == 200
    r = client.post("/v1/completions", json=body, headers={**key, "Last-Event-ID": "1"})
    ids = [int(e[4:].split("\n")[0]) for e in r.text.split("\n\n") if e.startswith("id: ")]
    assert ids == [2, 3, 4] and len(stubs.producer.sent) == 1
    # The same request as a plain POST: its stored answer, not a second generation.
    plain = client.post("/v1/completions", json={**body, "stream": False}, headers=key)
    assert plain.json()["choices"][0]["text"] == "Hello, world"
    assert len(stubs.producer.sent) == 1


def test_a_completion_is_resumed_by_id(api: tuple[TestClient, Stubs]) -> None:
    client, _ = api
    body = {"model": "gristmill-lm", "prompt": "hi", "max_tokens": 4}
    cid = client.post("/v1/completions", json=body).json()["id"]
    got = client.get(f"/v1/completions/{cid}")
    assert got.status_code == 200 and got.json()["choices"][0]["text"] == "Hello, world"
    streamed = client.get(f"/v1/completions/{cid}?stream=true", headers={"Last-Event-ID": "2"})
    ids = [int(e[4:].split("\n")[0]) for e in streamed.text.split("\n\n") if e.startswith("id: ")]
    assert ids == [3, 4]
    unknown = client.get(f"/v1/completions/cmpl-{uuid.uuid4()}")
    assert unknown.status_code == 404


def test_kserve_health_and_metadata_stay_public(api: tuple[TestClient, Stubs]) -> None:
    client, _ = api
    no_key = {"Authorization": ""}
    assert client.get("/v2/health/live", headers=no_key).json() == {"live": True}
    assert client.get("/v2/models/sim", headers=no_key).status_code == 200
    assert client.get("/v2/models/sim/ready", headers=no_key).json()["ready"] is True
    # The gate checks inference only: another method is the route's 405, not a 401.
    assert client.get("/v2/models/sim/infer", headers=no_key).status_code == 405
