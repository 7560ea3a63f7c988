"""Async batch jobs over real HTTP, Kafka and PostgreSQL."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import openai
import orjson
import pytest
import standardwebhooks

from core.models.sim import sim_output
from gristmill.devservices.stack import System
from ingest.jobs import webhook_events as ev
from tests.e2e.webhook_receiver import Hook, serve


def submit(
    system: System, body: dict[str, Any], tier: str = "paid", headers: dict[str, str] | None = None
) -> httpx.Response:
    return httpx.post(
        f"{system.url}/v1/jobs",
        json=body,
        headers={**system.headers(tier), **(headers or {})},
        timeout=120,
    )


def wait_done(
    system: System, job_id: str, tier: str = "paid", timeout_s: float = 120
) -> dict[str, Any]:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        j = httpx.get(f"{system.url}/v1/jobs/{job_id}", headers=system.headers(tier)).json()
        if j["status"] in ("completed", "failed", "cancelled", "expired") and j["finished_at"]:
            return dict(j)
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} not finished: {j}")


def all_results(system: System, job_id: str, tier: str = "paid") -> list[dict[str, Any]]:
    r = httpx.get(
        f"{system.url}/v1/jobs/{job_id}/results", headers=system.headers(tier), timeout=120
    )
    assert r.status_code == 200
    return [orjson.loads(line) for line in r.content.splitlines() if line]


def test_small_job_completes_in_order_with_custom_ids(system: System) -> None:
    items = [{"custom_id": f"c{i}", "input": f"item {i}"} for i in range(250)]
    r = submit(system, {"model": "sim", "items": items, "metadata": {"run": "t1"}})
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["counts"]["total"] == 250 and job["status"] in ("queued", "running", "completed")
    done = wait_done(system, job["job_id"])
    assert done["status"] == "completed" and done["counts"]["succeeded"] == 250
    assert done["metadata"] == {"run": "t1"} and done["progress"] == 1.0
    results = all_results(system, job["job_id"])
    assert [x["index"] for x in results] == list(range(250))
    assert [x["custom_id"] for x in results] == [f"c{i}" for i in range(250)]
    assert all(x["output"] == sim_output(f"item {x['index']}") for x in results)
    page = httpx.get(
        f"{system.url}/v1/jobs/{job['job_id']}/items?cursor=200&limit=30", headers=system.headers()
    ).json()
    assert [x["index"] for x in page["items"]] == list(range(200, 230))
    assert page["next_cursor"] == 230


@pytest.mark.slow
def test_ten_thousand_item_jsonl_job_comes_back_complete_and_ordered(system: System) -> None:
    n = 10_000
    tag = uuid.uuid4().hex[:6]
    body = b"".join(orjson.dumps({"input": f"{tag}-{i}"}) + b"\n" for i in range(n))
    r = httpx.post(
        f"{system.url}/v1/jobs?model=sim",
        content=body,
        timeout=120,
        headers={**system.headers(), "Content-Type": "application/x-ndjson"},
    )
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    done = wait_done(system, job_id, timeout_s=240)
    assert done["counts"] == {
        "total": n,
        "queued": 0,
        "succeeded": n,
        "failed": 0,
        "expired": 0,
        "cancelled": 0,
    }
    results = all_results(system, job_id)
    assert len(results) == n
    assert all(
        x["index"] == i and x["output"] == sim_output(f"{tag}-{i}") for i, x in enumerate(results)
    )


def test_invalid_item_rejects_the_whole_job_naming_it(system: System) -> None:
    before = httpx.get(f"{system.url}/v1/jobs?limit=100", headers=system.headers("free")).json()
    items = [{"input": "fine"}, {"input": ""}, {"input": "fine"}]
    r = submit(system, {"model": "sim", "items": items}, tier="free")
    assert r.status_code == 400 and r.json()["error"]["field"] == "items[1].input"
    body = b'{"input": "ok"}\n{"input": 5}\n'
    r = httpx.post(
        f"{system.url}/v1/jobs?model=sim",
        content=body,
        headers={**system.headers("free"), "Content-Type": "application/x-ndjson"},
    )
    assert r.status_code == 400 and "line 2" in r.json()["error"]["message"]
    r = httpx.post(
        f"{system.url}/v1/jobs?model=sim",
        content=b'{"input": "ok"}\n{oops\n',
        headers={**system.headers("free"), "Content-Type": "application/x-ndjson"},
    )
    assert r.status_code == 400 and "line 2" in r.json()["error"]["message"]
    after = httpx.get(f"{system.url}/v1/jobs?limit=100", headers=system.headers("free")).json()
    assert len(after["jobs"]) == len(before["jobs"])  # nothing half-created


@pytest.mark.parametrize(
    "body,status",
    [
        ({"items": [{"input": "x"}]}, 422),
        ({"model": "sim"}, 422),
        ({"model": "sim", "items": []}, 400),
        ({"model": "nope", "items": [{"input": "x"}]}, 404),
        ({"model": "sim", "items": [{"input": "x"}], "completion_window_s": 0}, 400),
        ({"model": "sim", "items": [{"input": "x"}], "webhook_url": "ftp://x"}, 400),
    ],
)
def test_bad_job_requests(system: System, body: dict[str, Any], status: int) -> None:
    assert submit(system, body).status_code == status


def test_idempotent_job_submission(system: System) -> None:
    key = f"job-{uuid.uuid4()}"
    body = {"model": "sim", "items": [{"input": "a"}, {"input": "b"}]}
    a = submit(system, body, headers={"Idempotency-Key": key})
    b = submit(system, body, headers={"Idempotency-Key": key})
    assert a.status_code == b.status_code == 202
    assert a.json()["job_id"] == b.json()["job_id"]
    c = submit(system, {**body, "items": [{"input": "c"}]}, headers={"Idempotency-Key": key})
    assert c.status_code == 422


def test_jobs_are_private_to_their_tenant(system: System) -> None:
    job_id = submit(system, {"model": "sim", "items": [{"input": "mine"}]}).json()["job_id"]
    for path in ("", "/items", "/results"):
        r = httpx.get(f"{system.url}/v1/jobs/{job_id}{path}", headers=system.headers("free"))
        assert r.status_code == 404
    assert (
        httpx.post(
            f"{system.url}/v1/jobs/{job_id}/cancel", headers=system.headers("free")
        ).status_code
        == 404
    )
    listed = httpx.get(f"{system.url}/v1/jobs", headers=system.headers("free")).json()["jobs"]
    assert job_id not in {j["job_id"] for j in listed}
    assert (
        httpx.get(f"{system.url}/v1/jobs/not-a-uuid", headers=system.headers()).status_code == 404
    )


def test_cancel_stops_unstarted_items_and_keeps_finished_ones(system: System) -> None:
    n = 10_000  # far more than the workers finish before the cancel lands
    items = [{"input": f"cancel {i}"} for i in range(n)]
    job_id = submit(system, {"model": "sim", "items": items}, tier="free").json()["job_id"]
    r = httpx.post(f"{system.url}/v1/jobs/{job_id}/cancel", headers=system.headers("free"))
    assert r.status_code == 202 and r.json()["status"] in ("cancelling", "cancelled")
    done = wait_done(system, job_id, tier="free")
    c = done["counts"]
    assert done["status"] == "cancelled"
    assert c["cancelled"] > 0 and c["succeeded"] + c["cancelled"] == n
    results = all_results(system, job_id, tier="free")
    assert all(
        x["output"] == sim_output(f"cancel {x['index']}")
        for x in results
        if x["status"] == "succeeded"
    )
    # and the cancelled items can be run again as a new attempt
    r = httpx.post(f"{system.url}/v1/jobs/{job_id}/retry", headers=system.headers("free"))
    assert r.status_code == 202, r.text
    again = wait_done(system, job_id, tier="free")
    assert again["status"] == "completed" and again["counts"]["succeeded"] == n
    assert again["attempt"] == 1


def test_completion_window_expires_unfinished_items(system: System) -> None:
    items = [{"input": f"slow {i}"} for i in range(4000)]
    # A window the quote says cannot be met is refused (409, decision 69) unless the
    # caller takes what the window allows: Prefer: partial-results.
    body = {"model": "sim", "items": items, "completion_window_s": 1}
    refused = submit(system, body, tier="free")
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["field"] == "completion_window_s"
    job_id = submit(system, body, tier="free", headers={"Prefer": "partial-results"}).json()[
        "job_id"
    ]
    done = wait_done(system, job_id, tier="free", timeout_s=120)
    assert done["counts"]["expired"] > 0
    assert done["status"] in ("expired", "completed")


def test_webhook_is_signed_and_delivered_on_completion(system: System) -> None:
    server = serve()
    try:
        url = f"http://127.0.0.1:{server.server_port}/hook"
        r = submit(system, {"model": "sim", "items": [{"input": "hook"}], "webhook_url": url})
        secret = r.json()["webhook_secret"]
        deadline = time.time() + 60
        while not Hook.received and time.time() < deadline:
            time.sleep(0.2)
        body, headers = Hook.received[0]
        # Standard Webhooks (decision 53): the receivers' own tools verify it.
        event = standardwebhooks.Webhook(secret).verify(body, headers)
        assert event["job_id"] == r.json()["job_id"] and event["status"] == "completed"
        assert headers["webhook-id"] == event["id"] == ev.event_id(r.json()["job_id"])
        sdk = openai.OpenAI(api_key="unused", base_url=f"{system.url}/v1")
        sdk.webhooks.verify_signature(body, headers, secret=secret)
        with pytest.raises(openai.InvalidWebhookSignatureError):
            sdk.webhooks.verify_signature(body, headers, secret=ev.new_secret())
        # The deprecated header, for one release.
        legacy = headers[ev.LEGACY_SIGNATURE_HEADER.lower()]
        assert ev.legacy_verify(secret, body, legacy, int(time.time()))
        assert not ev.legacy_verify("whsec_wrong", body, legacy, int(time.time()))
    finally:
        server.shutdown()
