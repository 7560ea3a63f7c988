"""Incremental jobs (decision 61) over real HTTP, Kafka and PostgreSQL: a job re-submitted
with a few items changed reuses its base's results for the rest, its output equal to a
full recomputation, in input order; and no tenant reuses another's."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
import standardwebhooks
from sqlalchemy import text

from gristmill.devservices.stack import Services, System, build_system
from results.db import make_engine
from results.job_reuse import copy_reused
from tests.e2e.webhook_receiver import Hook, serve

N = 300
CHANGED = {i for i in range(N) if i % 20 == 7}  # 15 items of 300 (5%)
DIM = 8  # sim answers float32 vectors, as an embedding model does


@pytest.fixture(scope="module")
def vsys(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    s = build_system(
        services,
        tmp_path_factory.mktemp("incremental"),
        sim_batch_ms=20,
        extra_env={"GRISTMILL_SIM_VECTOR_DIM": str(DIM)},
    )
    try:
        s.start_scheduler(models="sim")
        s.url = s.start_api()
        s.wait_until_serving("sim")
        yield s
    finally:
        s.close()


def submit_json(s: System, items: list[str], tier: str = "paid", **opts: Any) -> httpx.Response:
    body = {
        "model": "sim",
        "items": [{"custom_id": f"c{i}", "input": x} for i, x in enumerate(items)],
    }
    return httpx.post(
        f"{s.url}/v1/jobs", json={**body, **opts}, headers=s.headers(tier), timeout=120
    )


def submit_jsonl(s: System, items: list[str], base_job_id: str) -> httpx.Response:
    body = b"".join(
        orjson.dumps({"custom_id": f"n{i}", "input": x}) + b"\n" for i, x in enumerate(items)
    )
    return httpx.post(
        f"{s.url}/v1/jobs?model=sim&base_job_id={base_job_id}",
        content=body,
        headers={**s.headers(), "Content-Type": "application/x-ndjson"},
        timeout=120,
    )


def accepted(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 202, r.text
    return dict(r.json())


def wait_done(s: System, job_id: str, tier: str = "paid") -> dict[str, Any]:
    deadline = time.time() + 120
    while True:
        j = httpx.get(f"{s.url}/v1/jobs/{job_id}", headers=s.headers(tier)).json()
        if j["finished_at"]:
            return dict(j)
        assert time.time() < deadline, j
        time.sleep(0.3)


def results(s: System, job_id: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{s.url}/v1/jobs/{job_id}/results", headers=s.headers(), timeout=120)
    assert r.status_code == 200, r.text
    return [orjson.loads(line) for line in r.content.splitlines()]


def corpus(version: str) -> list[str]:
    return [f"doc {i} {version if i in CHANGED else 'v1'}" for i in range(N)]


def test_an_incremental_job_reuses_unchanged_items_and_equals_a_full_recomputation(
    vsys: System,
) -> None:
    base = accepted(submit_json(vsys, corpus("v1")))
    assert base["usage"] == {"reused_items": 0, "computed_items": 0}
    assert wait_done(vsys, base["job_id"])["status"] == "completed"

    # The corpus changed a little: a JSONL upload names the first job as its base.
    inc = accepted(submit_jsonl(vsys, corpus("v2"), base["job_id"]))
    assert inc["base_job_id"] == base["job_id"]
    assert inc["usage"]["reused_items"] == N - len(CHANGED)  # known at the 202
    inc_done = wait_done(vsys, inc["job_id"])
    full = accepted(submit_json(vsys, corpus("v2")))  # the same items, all computed
    full_done = wait_done(vsys, full["job_id"])

    assert inc_done["status"] == "completed"
    assert inc_done["counts"]["succeeded"] == N and inc_done["counts"]["queued"] == 0
    assert inc_done["usage"] == {"reused_items": N - len(CHANGED), "computed_items": len(CHANGED)}
    assert full_done["usage"] == {"reused_items": 0, "computed_items": N}
    got, want = results(vsys, inc["job_id"]), results(vsys, full["job_id"])
    assert [x["index"] for x in got] == list(range(N))  # complete, in input order
    assert [x["custom_id"] for x in got] == [f"n{i}" for i in range(N)]  # its own ids
    assert [x["output"] for x in got] == [x["output"] for x in want]
    assert all(len(x["output"]) == DIM for x in got)
    assert [x["reused"] for x in got] == [i not in CHANGED for i in range(N)]
    assert not any(x["reused"] for x in want)
    assert all(x["attempts"] == 0 for x in got if x["reused"])

    # Nothing changed since: every item is reused and the job is finished at its 202,
    # lending from a job whose own results were partly reused.
    again = accepted(submit_json(vsys, corpus("v2"), base_job_id=inc["job_id"]))
    assert again["status"] == "completed" and again["finished_at"] is not None
    assert again["usage"] == {"reused_items": N, "computed_items": 0}
    assert [x["output"] for x in results(vsys, again["job_id"])] == [x["output"] for x in want]

    # Params are part of what an item is: another salt reuses nothing.
    salted = accepted(
        submit_json(vsys, corpus("v2"), base_job_id=full["job_id"], params={"salt": "s"})
    )
    assert salted["usage"]["reused_items"] == 0
    assert wait_done(vsys, salted["job_id"])["usage"] == {"reused_items": 0, "computed_items": N}


def test_a_publish_that_died_before_its_copy_is_taken_over_and_copies_once(
    vsys: System,
) -> None:
    """The reused rows are copied by the publish, after the changed items are in Kafka
    (results/job_reuse.py). An API that died between the two leaves the job
    'submitting' with its changed items computed and no reused row: another instance's
    stale pass takes it over, copies, and the job finishes as if nothing happened; a
    further copy inserts and counts nothing."""
    base = accepted(submit_json(vsys, corpus("t1")))
    wait_done(vsys, base["job_id"])
    inc = accepted(submit_json(vsys, corpus("t2"), base_job_id=base["job_id"]))
    want = [x["output"] for x in results(vsys, wait_done(vsys, inc["job_id"])["job_id"])]
    jid = inc["job_id"]
    engine = make_engine(vsys.settings.database_url)
    try:
        with engine.begin() as conn:  # back to the moment the first publish died
            conn.execute(
                text("DELETE FROM requests WHERE job_id = :j AND attempts = 0"), {"j": jid}
            )
            conn.execute(
                text(
                    "UPDATE jobs SET succeeded = succeeded - reused, reused = 0, "
                    "finished_at = NULL, webhook_next_at = NULL, submit_state = 'submitting', "
                    "submit_heartbeat_at = now() - interval '1 hour' WHERE job_id = :j"
                ),
                {"j": jid},
            )
        assert (
            httpx.get(f"{vsys.url}/v1/jobs/{jid}", headers=vsys.headers()).json()["finished_at"]
            is None
        )
        done = wait_done(vsys, jid)  # the stale pass (every 5 s) takes it over
        assert done["usage"] == {"reused_items": N - len(CHANGED), "computed_items": len(CHANGED)}
        assert done["counts"]["succeeded"] == N
        got = results(vsys, jid)
        assert [x["output"] for x in got] == want
        assert [x["reused"] for x in got] == [i not in CHANGED for i in range(N)]
        assert copy_reused(engine, jid) == frozenset()  # nothing left to copy
        again = httpx.get(f"{vsys.url}/v1/jobs/{jid}", headers=vsys.headers()).json()
        assert again["usage"] == done["usage"] and again["counts"] == done["counts"]
    finally:
        engine.dispose()


def test_another_tenant_naming_a_job_as_base_gets_404_and_reuses_nothing(vsys: System) -> None:
    theirs = accepted(submit_json(vsys, corpus("v1")))
    wait_done(vsys, theirs["job_id"])
    before = httpx.get(f"{vsys.url}/v1/jobs", headers=vsys.headers("free")).json()["jobs"]
    for raw in (theirs["job_id"], "00000000-0000-0000-0000-000000000000", "not-a-job"):
        r = submit_json(vsys, corpus("v1"), tier="free", base_job_id=raw)
        assert r.status_code == 404, r.text
        assert r.json()["error"]["field"] == "base_job_id"
    after = httpx.get(f"{vsys.url}/v1/jobs", headers=vsys.headers("free")).json()["jobs"]
    assert after == before  # nothing was created, so nothing was reused
    # The same items of its own, without a base: computed, whatever the other stored.
    own = accepted(submit_json(vsys, corpus("v1"), tier="free"))
    assert wait_done(vsys, own["job_id"], "free")["usage"]["reused_items"] == 0


def test_a_base_still_running_is_refused_naming_it(vsys: System) -> None:
    body = b"".join(orjson.dumps({"input": f"slow {i}"}) + b"\n" for i in range(50_000))
    running = accepted(
        httpx.post(
            f"{vsys.url}/v1/jobs?model=sim",
            content=body,
            headers={**vsys.headers(), "Content-Type": "application/x-ndjson"},
            timeout=120,
        )
    )
    r = submit_json(vsys, ["x"], base_job_id=running["job_id"])
    assert r.status_code == 400 and "not finished" in r.json()["error"]["message"]
    assert r.json()["error"]["field"] == "base_job_id"
    httpx.post(f"{vsys.url}/v1/jobs/{running['job_id']}/cancel", headers=vsys.headers())


def test_a_job_finished_at_its_202_still_calls_its_webhook(vsys: System) -> None:
    items = [f"hooked {i}" for i in range(20)]
    base = accepted(submit_json(vsys, items))
    wait_done(vsys, base["job_id"])
    server = serve()
    try:
        url = f"http://127.0.0.1:{server.server_port}/hook"
        j = accepted(submit_json(vsys, items, base_job_id=base["job_id"], webhook_url=url))
        assert j["status"] == "completed"
        deadline = time.time() + 30
        while not Hook.received and time.time() < deadline:
            time.sleep(0.2)
        body, headers = Hook.received[0]
        event = standardwebhooks.Webhook(j["webhook_secret"]).verify(body, headers)
        assert event["job_id"] == j["job_id"] and event["status"] == "completed"
    finally:
        server.shutdown()


def sdk(s: System, tier: str = "paid") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key=s.keys[tier], max_retries=0)


def batch_of(c: openai.OpenAI, texts: list[str], **extra: Any) -> Any:
    lines = [
        {
            "custom_id": f"e-{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "sim", "input": t, "encoding_format": "float"},
        }
        for i, t in enumerate(texts)
    ]
    raw = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    f = c.files.create(file=("in.jsonl", raw), purpose="batch")
    b = c.batches.create(
        input_file_id=f.id,
        endpoint="/v1/embeddings",
        completion_window="24h",
        extra_body=extra or None,
    )
    deadline = time.time() + 120
    while b.status not in ("completed", "failed", "cancelled", "expired"):
        assert time.time() < deadline, b
        time.sleep(0.3)
        b = c.batches.retrieve(b.id)
    return b


def embeddings(c: openai.OpenAI, b: Any) -> list[list[float]]:
    lines = [json.loads(x) for x in c.files.content(b.output_file_id).text.splitlines()]
    assert [x["custom_id"] for x in lines] == [f"e-{i}" for i in range(len(lines))]
    return [x["response"]["body"]["data"][0]["embedding"] for x in lines]


def test_an_incremental_batch_through_the_openai_sdk(vsys: System) -> None:
    c = sdk(vsys)
    first = batch_of(c, [f"line {i}" for i in range(40)])
    texts = [f"line {i}" if i % 10 else f"line {i} edited" for i in range(40)]
    inc = batch_of(c, texts, base_batch_id=first.id)
    full = batch_of(c, texts)
    assert inc.status == full.status == "completed"
    assert inc.request_counts.completed == 40
    assert (inc.request_counts.model_extra or {}).get("reused") == 36
    assert (full.request_counts.model_extra or {}).get("reused") == 0
    assert embeddings(c, inc) == embeddings(c, full)
    # Another tenant's batch is not there to name.
    with pytest.raises(openai.NotFoundError):
        batch_of(sdk(vsys, "free"), texts, base_batch_id=first.id)
