"""``Prefer: partial-results`` through the whole API on in-memory stand-ins
(tests/unit/ingest/stubs.py), decision 63: at the deadline, 200 with the inputs done,
the rest kept running past it (their messages say until when) and answered to the same
Idempotency-Key later without a resend. Real Kafka, PostgreSQL and the openai SDK:
tests/e2e/test_partial_embeddings.py."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from core.messages import KEEP_UNTIL
from ingest.edge.refusal_counts import TIMEOUTS
from ingest.openai.partial import MISSING_HEADER
from tests.unit.ingest.stubs import Stubs

EMBED = "all-minilm-l6-v2"
PARTIAL = {"Prefer": "partial-results"}
BODY = {"model": EMBED, "input": ["a", "slow", "c"], "timeout_ms": 50}


def test_the_deadline_answers_200_with_the_inputs_done_and_where_the_rest_are(
    api: tuple[TestClient, Stubs],
) -> None:
    client, stubs = api
    stubs.worker.held = {"slow"}
    TIMEOUTS.drain()
    r = client.post("/v1/embeddings", json=BODY, headers=PARTIAL)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [d["index"] for d in body["data"]] == [0, 2]
    assert len(body["data"][0]["embedding"]) == 384
    first = stubs.producer.sent[0][1].request_id
    where = f"/v1/embeddings/{first}?inputs=3"
    assert body["partial"] == {"done": 2, "missing": 1, "total": 3, "location": where}
    assert r.headers[MISSING_HEADER] == "1" and r.headers["Location"] == where
    assert r.headers["Preference-Applied"] == "partial-results"
    assert body["usage"]["prompt_tokens"] > 0 and r.headers["RateLimit-Limit"]
    # The missing input missed its deadline (the request log tells its row came later).
    assert [t.request_id for t in TIMEOUTS.drain()] == [stubs.producer.sent[1][1].request_id]


def test_the_inputs_are_kept_running_past_the_deadline(api: tuple[TestClient, Stubs]) -> None:
    client, stubs = api
    stubs.worker.held = {"slow"}
    client.post("/v1/embeddings", json=BODY, headers=PARTIAL)
    for _, m in stubs.producer.sent:
        # As long as any sync request may be given: max_timeout_ms from its arrival.
        assert m.extra[KEEP_UNTIL] == m.received_at + stubs.settings.max_timeout_ms / 1000
        assert m.deadline == pytest.approx(m.received_at + 0.05)
    client.post("/v1/embeddings", json={**BODY, "input": ["plain"]})
    assert KEEP_UNTIL not in stubs.producer.sent[-1][1].extra  # only when asked


def test_the_same_idempotency_key_gets_the_rest_without_a_resend(
    api: tuple[TestClient, Stubs],
) -> None:
    client, stubs = api
    stubs.worker.held = {"slow"}
    key = {**PARTIAL, "Idempotency-Key": "partial-1"}
    first = client.post("/v1/embeddings", json=BODY, headers=key)
    assert first.json()["partial"]["missing"] == 1
    # Still running: the retry waits for it (its deadline passed, but the first
    # attempt's inputs run on), and answers what is done by its own deadline.
    again = client.post("/v1/embeddings", json=BODY, headers=key)
    assert again.status_code == 200 and again.json()["partial"]["missing"] == 1
    assert len(stubs.producer.sent) == 3
    stubs.worker.held = set()
    stubs.worker.answer_in_loop(stubs.producer.sent[1][1])
    done = client.post("/v1/embeddings", json=BODY, headers=key)
    assert done.status_code == 200, done.text
    assert [d["index"] for d in done.json()["data"]] == [0, 1, 2]
    assert "partial" not in done.json() and MISSING_HEADER not in done.headers
    assert len(stubs.producer.sent) == 3  # nothing sent, so nothing computed, twice
    # Every vector the partial answer gave is the one the full answer gives.
    assert first.json()["data"] == [done.json()["data"][0], done.json()["data"][2]]


def test_without_the_preference_the_deadline_is_504_naming_it(
    api: tuple[TestClient, Stubs],
) -> None:
    client, stubs = api
    stubs.worker.held = {"slow"}
    r = client.post("/v1/embeddings", json=BODY)
    assert r.status_code == 504 and "Prefer: partial-results" in r.json()["error"]["message"]


def test_none_done_is_the_deadlines_504_still_saying_where_the_rest_are(
    api: tuple[TestClient, Stubs],
) -> None:
    """OpenAI's SDK refuses an answer with an empty ``data``: no 200 without one input."""
    client, stubs = api
    stubs.worker.hold = True
    TIMEOUTS.drain()
    r = client.post("/v1/embeddings", json=BODY, headers=PARTIAL)
    assert r.status_code == 504 and r.json()["error"]["type"] == "timeout_error"
    where = f"/v1/embeddings/{stubs.producer.sent[0][1].request_id}?inputs=3"
    assert r.headers["Location"] == where and r.headers[MISSING_HEADER] == "3"
    assert where in r.json()["error"]["message"]
    assert len(TIMEOUTS.drain()) == 3
    assert all(KEEP_UNTIL in m.extra for _, m in stubs.producer.sent)


def test_respond_async_wins_over_partial_results(api: tuple[TestClient, Stubs]) -> None:
    client, stubs = api
    stubs.worker.held = {"slow"}
    r = client.post(
        "/v1/embeddings", json=BODY, headers={"Prefer": "respond-async, partial-results"}
    )
    assert r.status_code == 202 and r.headers["Preference-Applied"] == "respond-async"
    assert KEEP_UNTIL not in stubs.producer.sent[0][1].extra


def test_a_failed_input_is_the_error_of_a_partial_answer_too(
    api: tuple[TestClient, Stubs],
) -> None:
    client, stubs = api
    stubs.worker.held = {"slow"}
    stubs.worker.fail = {"c"}
    r = client.post("/v1/embeddings", json=BODY, headers=PARTIAL)
    assert r.status_code >= 400 and r.json()["error"]["param"] == "input[2]"


def test_the_location_wants_a_key_and_a_well_formed_query(
    api: tuple[TestClient, Stubs],
) -> None:
    client, _ = api
    where = "/v1/embeddings/0b5c0f7e-4f3a-4a39-9c53-6f0c3f6e2a11"
    assert client.get(f"{where}?inputs=3", headers={"Authorization": ""}).status_code == 401
    r = client.get(f"{where}?inputs=5000")
    assert r.status_code == 400 and r.json()["error"]["param"] == "inputs"
    r = client.get("/v1/embeddings/not-a-uuid?inputs=3")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
