"""``Prefer: partial-results`` (decision 63) over real HTTP, Kafka and PostgreSQL with the
official ``openai`` SDK: a multi-input call whose deadline passes answers 200 with the
inputs done, the SDK parses it, the rest is fetched at the Location and with the same
Idempotency-Key, nothing is produced (so nothing computed) twice, and every vector is
the one a full call gives."""

from __future__ import annotations

import base64
import time
import uuid
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from confluent_kafka import Consumer, TopicPartition

from core.topics import request_topic
from gristmill.devservices.stack import System

MODEL = "all-minilm-l6-v2"
DIM = 384
N = 1024  # inputs a call: several batches of the CPU model, seconds of work
# How many inputs finish by a deadline depends on the machine and its load, not on this
# test: from a first deadline, halved while all finish and doubled while none does.
FIRST_TIMEOUT_MS, TRIES = 1000, 6


def produced(system: System) -> int:
    """Messages ever produced to the paid tier's request topic (its partitions' ends)."""
    s = system.settings
    topic = request_topic(s, "paid")
    c = Consumer({"bootstrap.servers": s.kafka_bootstrap, "group.id": "partial-count"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts)
    finally:
        c.close()


def floats(item: Any) -> np.ndarray:
    """An answer item's embedding: the SDK's list, or the base64 a GET carries."""
    if isinstance(item, str):
        return np.frombuffer(base64.b64decode(item), dtype="<f4")
    return np.asarray(item, dtype=np.float32)


def fetch_rest(system: System, location: str, timeout_s: float = 120) -> dict[str, Any]:
    """GET the Location until nothing is missing."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = httpx.get(f"{system.url}{location}", headers=system.headers(), timeout=30)
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        if "partial" not in body:
            assert "Gristmill-Missing" not in r.headers
            return body
        assert int(r.headers["Gristmill-Missing"]) == body["partial"]["missing"]
        assert time.monotonic() < deadline, f"still missing {body['partial']}"
        time.sleep(0.5)


def test_a_partial_answer_then_the_rest_by_location_and_by_the_same_key(
    served: System, client: openai.OpenAI
) -> None:
    client.embeddings.create(model=MODEL, input="warm up")
    tried: list[tuple[int, int]] = []
    timeout_ms = FIRST_TIMEOUT_MS
    for _ in range(TRIES):
        texts = [f"partial {uuid.uuid4().hex[:8]} text number {i}" for i in range(N)]
        key = uuid.uuid4().hex
        headers = {"Prefer": "partial-results", "Idempotency-Key": key}
        try:
            raw = client.embeddings.with_raw_response.create(
                model=MODEL,
                input=texts,
                extra_headers=headers,
                extra_body={"timeout_ms": timeout_ms},
            )
        except openai.APIStatusError as exc:
            if exc.status_code == 504:  # none done: the rest runs on, fetched here
                assert exc.response.headers["Gristmill-Missing"] == str(N)
                tried.append((timeout_ms, N))
                fetch_rest(served, exc.response.headers["Location"])
            else:  # admission: the box too busy for it now
                assert exc.status_code == 503, exc
                tried.append((timeout_ms, -1))
            timeout_ms *= 2
            continue
        first = raw.parse()  # the SDK's own parsing (it asked for base64 and decoded it)
        missing = int(raw.headers.get("Gristmill-Missing", "0"))
        tried.append((timeout_ms, missing))
        if missing:
            break
        timeout_ms = max(served.settings.min_timeout_ms, timeout_ms // 2)
    else:
        pytest.fail(f"no deadline gave a partial answer (timeout_ms, missing): {tried}")

    print(f"partial answers (timeout_ms, missing of {N}): {tried}")  # shown with -s
    # The SDK parsed it: the done inputs with their indices, the rest named.
    assert raw.status_code == 200 and raw.headers["Preference-Applied"] == "partial-results"
    extra = first.model_extra or {}
    assert extra["partial"] == {
        "done": N - missing,
        "missing": missing,
        "total": N,
        "location": raw.headers["Location"],
    }
    assert len(first.data) == N - missing and all(len(d.embedding) == DIM for d in first.data)
    assert [d.index for d in first.data] == sorted(d.index for d in first.data)
    got = {d.index: floats(d.embedding) for d in first.data}
    after_first = produced(served)

    # The rest at the Location (base64, as the SDK asked): every input, once all finish.
    rest = fetch_rest(served, raw.headers["Location"])
    assert [d["index"] for d in rest["data"]] == list(range(N))
    by_location = {d["index"]: floats(d["embedding"]) for d in rest["data"]}
    for i, v in got.items():
        assert np.array_equal(by_location[i], v)  # the same stored row, bit for bit

    # The same POST with the same Idempotency-Key: all of them, nothing sent again.
    again = client.embeddings.create(
        model=MODEL, input=texts, extra_headers=headers, extra_body={"timeout_ms": timeout_ms}
    )
    assert "partial" not in (again.model_extra or {}) and len(again.data) == N
    for d in again.data:
        assert np.array_equal(floats(d.embedding), by_location[d.index])
    assert again.usage.prompt_tokens > 0
    assert produced(served) == after_first  # no input produced, so none computed, twice

    # Every vector is the one a full call gives (its own batches: equal to float noise).
    full = client.embeddings.create(
        model=MODEL, input=texts, extra_body={"timeout_ms": 120_000}, timeout=150
    )
    assert len(full.data) == N
    for d in full.data:
        np.testing.assert_allclose(floats(d.embedding), by_location[d.index], atol=1e-5)


def test_without_the_preference_the_deadline_is_still_504(
    served: System, client: openai.OpenAI
) -> None:
    texts = [f"whole {uuid.uuid4().hex[:8]} {i}" for i in range(N)]
    with pytest.raises(openai.APIStatusError) as e:
        client.embeddings.create(model=MODEL, input=texts, extra_body={"timeout_ms": 200})
    assert e.value.status_code in (503, 504)  # 503: admission saw the backlog first
    if e.value.status_code == 504:
        assert "partial-results" in e.value.message
