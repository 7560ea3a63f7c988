"""``service_tier: "flex"`` (decision 66) over real HTTP, Kafka and PostgreSQL: accepted
while a sync tier is refused for capacity and answered later at its Location; through
the official ``openai`` SDK (``extra_body``) and ``tritonclient`` (the X-Service-Tier
header), echoed, and written to the request log as flex, queued with job items; a 202 carries
its completion quote as a job's does."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as triton
from sqlalchemy import Text, cast, func, literal, select

from gristmill.devservices.stack import System
from ingest.acceptance.deferred import COMPLETION_HEADER
from results.db import make_engine
from results.schema import requests
from tests.e2e.backlog import burst_into_kafka, done_count, new_tenant_id, queued_paid

MODEL = "all-minilm-l6-v2"
DIM = 384


def row_of_input(system: System, text: str) -> Any:
    with make_engine(system.settings.database_url).connect() as conn:
        return conn.execute(
            select(requests.c.priority, requests.c.service_tier, requests.c.job_id).where(
                requests.c.input == func.to_jsonb(cast(literal(text), Text))
            )
        ).one()


def test_flex_is_accepted_while_a_sync_tier_is_refused_and_answered_later(
    system: System,
) -> None:
    """Paid work queued past what free's 5 s SLO leaves: a free sync request is refused
    503; the same key's flex request is accepted (202 once its caller's patience, 1 s,
    is spent), runs behind the backlog and is fetched at its Location."""
    n = 20_000  # 10 s of the test system's capacity
    noisy = new_tenant_id(system, "paid")
    burst_into_kafka(system, noisy, n)
    url = system.url
    try:
        deadline = time.time() + 10
        while time.time() < deadline and queued_paid(system) < 12_000:
            time.sleep(0.1)
        time.sleep(1.0)  # the API instance reads the load reports four times a second
        free = system.headers("free")
        text = f"flex {uuid.uuid4().hex}"
        sync = httpx.post(
            f"{url}/v1/infer", json={"model": "sim", "input": "x"}, headers=free, timeout=30
        )
        assert sync.status_code == 503, sync.text
        sent = time.time()
        flex = httpx.post(
            f"{url}/v1/infer",
            json={"model": "sim", "input": text, "service_tier": "flex"},
            headers={**free, "Prefer": "wait=1"},
            timeout=30,
        )
        assert flex.status_code == 202, flex.text
        assert flex.headers["X-Service-Tier"] == "flex" and flex.json()["service_tier"] == "flex"
        where = flex.headers["Location"]
        assert where == f"/v1/requests/{flex.json()['request_id']}"
        # Its completion quote (decision 69), as a job's 202 carries it: workers serve
        # sim, so there is one, in the header and the body alike, not in the past.
        quote = int(flex.headers[COMPLETION_HEADER])
        assert quote == flex.json()["estimated_completion_at"]
        assert quote >= int(sent) - 1
        until = time.time() + 120
        while True:
            got = httpx.get(f"{url}{where}", headers=free, timeout=30)
            if got.status_code == 200:
                break
            assert got.status_code == 404 and time.time() < until, got.text
            time.sleep(0.5)
        assert got.json()["status"] == "succeeded" and got.json()["output"]
        row = row_of_input(system, text)
        assert (row.priority, row.service_tier, row.job_id) == ("jobs", "flex", None)
    finally:
        until = time.time() + 120  # leave no backlog for the tests that follow
        while time.time() < until and done_count(system, noisy) < n:
            time.sleep(0.5)


def test_openai_sdk_flex_embeddings_are_answered_echoed_and_logged(
    served: System, client: openai.OpenAI
) -> None:
    text = f"flex sdk {uuid.uuid4().hex}"
    raw = client.embeddings.with_raw_response.create(
        model=MODEL, input=text, encoding_format="float", extra_body={"service_tier": "flex"}
    )
    assert raw.headers["x-service-tier"] == "flex"
    flex = raw.parse()
    assert (flex.model_extra or {})["service_tier"] == "flex"
    plain = client.embeddings.create(model=MODEL, input=text, encoding_format="float")
    assert (plain.model_extra or {})["service_tier"] == "default"
    # The same model on the same text: flex changes when it runs, not what it computes.
    assert np.allclose(flex.data[0].embedding, plain.data[0].embedding, atol=1e-6)
    assert len(flex.data[0].embedding) == DIM
    with make_engine(served.settings.database_url).connect() as conn:
        tiers = conn.execute(
            select(requests.c.priority, requests.c.service_tier)
            .where(requests.c.input == func.to_jsonb(cast(literal(text), Text)))
            .order_by(requests.c.received_at)
        ).all()
    assert [tuple(t) for t in tiers] == [("jobs", "flex"), ("paid", "default")]
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=MODEL, input=text, extra_body={"service_tier": "slow"})
    assert "service_tier" in str(e.value)


@pytest.fixture(scope="module")
def tclient(served: System) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(served.url.removeprefix("http://"), network_timeout=60)
    yield c
    c.close()


def test_tritonclient_asks_for_flex_in_the_header(
    served: System, tclient: triton.InferenceServerClient
) -> None:
    text = f"flex triton {uuid.uuid4().hex}"
    inp = triton.InferInput("text", [1], "BYTES")
    inp.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    r = tclient.infer(MODEL, [inp], headers={**served.headers(), "X-Service-Tier": "flex"})
    assert r.as_numpy("embedding").shape == (1, DIM)
    assert tuple(row_of_input(served, text))[:2] == ("jobs", "flex")
