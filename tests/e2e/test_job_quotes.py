"""Completion-time quotes of jobs (decision 69) over real HTTP, Kafka and PostgreSQL:
a dry run quotes and records nothing, a running job's estimate is in the future and
near its actual finish, a window its quote cannot meet is refused naming the field."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import orjson

from gristmill.devservices.stack import System
from ingest.acceptance.deferred import COMPLETION_HEADER


def jsonl(n: int) -> bytes:
    tag = uuid.uuid4().hex[:6]
    return b"".join(orjson.dumps({"input": f"quote-{tag}-{i}"}) + b"\n" for i in range(n))


def post_jsonl(system: System, body: bytes, query: str, tier: str = "paid") -> httpx.Response:
    return httpx.post(
        f"{system.url}/v1/jobs?model=sim&{query}",
        content=body,
        headers={**system.headers(tier), "Content-Type": "application/x-ndjson"},
        timeout=120,
    )


def job_ids(system: System, tier: str = "paid") -> set[str]:
    r = httpx.get(f"{system.url}/v1/jobs?limit=100", headers=system.headers(tier), timeout=30)
    assert r.status_code == 200, r.text
    return {j["job_id"] for j in r.json()["jobs"]}


def live_quote(system: System, body: dict[str, Any]) -> dict[str, Any]:
    """A dry run's answer once the schedulers' load reports give the model a rate
    (the first reports come within seconds of the workers' start)."""
    deadline = time.time() + 60
    while True:
        r = httpx.post(
            f"{system.url}/v1/jobs?dry_run=true",
            json=body,
            headers=system.headers("paid"),
            timeout=60,
        )
        assert r.status_code == 200, r.text
        quote = dict(r.json())
        if quote["estimated_completion_at"] is not None or time.time() > deadline:
            return quote
        time.sleep(0.5)


def test_a_dry_run_returns_a_quote_and_creates_no_job(system: System) -> None:
    before = job_ids(system)
    items = [{"input": f"dry {i}"} for i in range(300)]
    t0 = time.time()
    quote = live_quote(system, {"model": "sim", "items": items, "completion_window_s": 3600})
    assert quote["dry_run"] is True and quote["total_items"] == 300
    assert quote["estimated_completion_at"] is not None, quote
    assert t0 - 1 <= quote["estimated_completion_at"] <= t0 + 3600
    assert quote["meets_window"] is True
    # The JSONL intake too; then still no job of either.
    r = post_jsonl(system, jsonl(1000), "dry_run=true")
    assert r.status_code == 200, r.text
    assert r.json()["total_items"] == 1000 and r.json()["estimated_completion_at"] is not None
    assert job_ids(system) == before


def test_a_running_jobs_estimate_is_in_the_future_and_roughly_right(system: System) -> None:
    t_submit = time.time()
    r = post_jsonl(system, jsonl(8000), "completion_window_s=3600")
    assert r.status_code == 202, r.text
    jid = r.json()["job_id"]
    assert r.headers.get(COMPLETION_HEADER) is not None
    assert int(r.headers[COMPLETION_HEADER]) == r.json()["estimated_completion_at"]
    seen: list[tuple[float, int]] = []  # (when read, the estimate) while it ran
    deadline = time.time() + 300
    while time.time() < deadline:
        j = httpx.get(f"{system.url}/v1/jobs/{jid}", headers=system.headers(), timeout=30).json()
        if j["finished_at"] is not None:
            assert j["estimated_completion_at"] is None  # finished: no quote
            break
        if j["status"] == "running" and 0.2 <= j["progress"] <= 0.8:
            seen.append((time.time(), j["estimated_completion_at"]))
        time.sleep(0.5)
    else:
        raise AssertionError(f"job {jid} did not finish")
    finished = time.time()
    assert seen, "never read while between 20% and 80% done"
    run_s = finished - t_submit
    for at, eta in seen:
        assert eta is not None and eta >= at - 1  # in the future (to the second)
        # Roughly right: a generous bound, the point is that it is wired to the load.
        assert abs(eta - finished) <= 0.5 * run_s + 5, (eta - finished, run_s)


def test_a_window_its_quote_cannot_meet_is_refused_naming_the_field(system: System) -> None:
    before = job_ids(system)
    body = jsonl(20_000)
    quote = post_jsonl(system, body, "dry_run=true&completion_window_s=1").json()
    assert quote["estimated_completion_at"] is not None and quote["meets_window"] is False
    r = post_jsonl(system, body, "completion_window_s=1")
    assert r.status_code == 409, r.text
    err = r.json()["error"]
    assert err["field"] == "completion_window_s"
    assert "earliest" in err["message"] and "completion_window_s >=" in err["message"]
    assert job_ids(system) == before
