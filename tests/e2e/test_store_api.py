"""Compact results and the API's side of the request log, over real HTTP, Kafka and
PostgreSQL: embeddings stored as float32 bytes and answered as floats; refusals counted
per second; a 504 whose result is stored later is told apart; an idempotent retry that
sends a request again still leaves it one row (issues 19 and 17)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from sqlalchemy import Engine, text

from gristmill.devservices.stack import Services, System, build_system
from results.db import make_engine
from results.tenants import create_tenant, issue_key, set_plan

EMBED = "all-minilm-l6-v2"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def system(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """Its own topics and scheduler: a test here stops and restarts it."""
    workdir: Path = tmp_path_factory.mktemp("store-api")
    sys_ = build_system(services, workdir, sim_batch_ms=50)
    try:
        sys_.start_scheduler(workers=1, models=f"sim,{EMBED}")
        sys_.url = sys_.start_api()
        sys_.wait_until_serving("sim")
        sys_.wait_until_serving(EMBED, timeout_s=300)
        yield sys_
    finally:
        sys_.close()


@pytest.fixture(scope="module")
def engine(system: System) -> Engine:
    return make_engine(system.settings.database_url, pool_size=2)


def wait_for(check: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.25)
    raise AssertionError("condition not met in time")


def test_an_embedding_is_stored_as_float32_and_answered_as_floats(
    system: System, engine: Engine
) -> None:
    r = httpx.post(
        f"{system.url}/v1/infer",
        headers=system.headers(),
        json={"model": EMBED, "input": "vectors in bytea"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    answer = r.json()["output"]
    assert isinstance(answer, list) and len(answer) == 384
    with engine.connect() as conn:
        output, vector, decoded = conn.execute(
            text(
                "SELECT output, output_vector, gristmill_vector(output_vector) "
                "FROM requests WHERE request_id = :r"
            ),
            {"r": r.json()["request_id"]},
        ).one()
    assert output is None and len(vector) == 384 * 4
    stored = np.frombuffer(vector, dtype="<f4")
    assert answer == stored.tolist()  # every float exactly its float32
    # The analysts' SQL decodes the same float32 values (a real[] reaches Python as the
    # shortest text that reads back as that float32, so compare as float32).
    assert np.array(decoded, dtype="<f4").tobytes() == vector
    assert abs(np.linalg.norm(stored) - 1) < 1e-5  # normalized by default


def test_a_json_output_is_unchanged(system: System, engine: Engine) -> None:
    r = httpx.post(
        f"{system.url}/v1/infer", headers=system.headers(), json={"model": "sim", "input": "x"}
    )
    assert r.status_code == 200 and r.json()["output"]["chars"] == 1
    with engine.connect() as conn:
        vector = conn.execute(
            text("SELECT output_vector FROM requests WHERE request_id = :r"),
            {"r": r.json()["request_id"]},
        ).scalar_one()
    assert vector is None


def job_results(system: System, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Submit ``items`` to the embedding model as a job, wait for it, read its results."""
    r = httpx.post(
        f"{system.url}/v1/jobs",
        headers=system.headers(),
        json={"model": EMBED, "items": items},
        timeout=30,
    )
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]

    def finished() -> Any:
        j = httpx.get(f"{system.url}/v1/jobs/{job_id}", headers=system.headers()).json()
        return j if j["finished_at"] else None

    assert wait_for(finished, 120)["counts"]["succeeded"] == len(items)
    res = httpx.get(f"{system.url}/v1/jobs/{job_id}/results", headers=system.headers())
    return [{"job_id": job_id, **orjson.loads(x)} for x in res.content.splitlines() if x]


def test_job_items_answer_the_stored_vectors(system: System, engine: Engine) -> None:
    items = [{"custom_id": f"e{i}", "input": f"job sentence {i}"} for i in range(5)]
    lines = job_results(system, items)
    with engine.connect() as conn:
        stored = dict(
            conn.execute(
                text(
                    "SELECT item_index, output_vector FROM requests WHERE job_id = :j "
                    "ORDER BY item_index"
                ),
                {"j": lines[0]["job_id"]},
            ).all()
        )
    for line in lines:
        assert line["output"] == np.frombuffer(stored[line["index"]], dtype="<f4").tolist()


def test_a_job_item_is_embedded_as_the_same_text_sent_alone(system: System) -> None:
    """A job's texts are tokenized on the worker's side (decision 60), a sync request's
    by the API (decision 52): the same text gets the same vector either way."""
    texts = ["Crème brûlée, naïve café.", "job and sync agree " * 40, "short"]
    by_job = {x["index"]: x["output"] for x in job_results(system, [{"input": t} for t in texts])}
    for i, t in enumerate(texts):
        alone = httpx.post(
            f"{system.url}/v1/embeddings",
            headers=system.headers(),
            json={"model": EMBED, "input": t},
            timeout=30,
        )
        assert alone.status_code == 200, alone.text
        vector = alone.json()["data"][0]["embedding"]
        np.testing.assert_allclose(by_job[i], vector, atol=1e-5)


def refused(engine: Engine, status: int, reason: str, tenant: str | None) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT coalesce(sum(count), 0) FROM refusals WHERE status = :s "
                    "AND reason = :r AND tenant_id IS NOT DISTINCT FROM CAST(:t AS uuid)"
                ),
                {"s": status, "r": reason, "t": tenant},
            ).scalar_one()
        )


def test_refusals_are_counted_per_tenant_and_reason(system: System, engine: Engine) -> None:
    with engine.begin() as conn:
        t = create_tenant(conn, f"slow-{uuid.uuid4().hex[:6]}", "free")
        set_plan(conn, t.name, rate_rps=1, burst=1)
        key = issue_key(conn, t)[1]
    codes = [
        httpx.post(
            f"{system.url}/v1/infer",
            headers={"Authorization": f"Bearer {key}"},
            json={"model": "sim", "input": f"r{i}"},
        ).status_code
        for i in range(8)
    ]
    limited = codes.count(429)
    assert limited >= 5
    for _ in range(4):
        bad = httpx.post(
            f"{system.url}/v1/infer",
            headers={"Authorization": "Bearer not-a-key"},
            json={"model": "sim", "input": "x"},
        )
        assert bad.status_code == 401
    wait_for(lambda: refused(engine, 429, "tenant_rate", t.id) == limited, 10)
    wait_for(lambda: refused(engine, 401, "unauthorized", None) >= 4, 10)
    with engine.connect() as conn:  # a handful of rows, not one per refusal
        rows = conn.execute(
            text("SELECT count(*) FROM refusals WHERE tenant_id = :t"), {"t": t.id}
        ).scalar_one()
    assert rows <= 3


def test_a_504_stored_later_is_a_late_answer_and_a_resent_request_keeps_one_row(
    system: System, engine: Engine
) -> None:
    """With the scheduler frozen (SIGSTOP: still reported live for a few seconds), a
    request times out (504) and its retry with the same Idempotency-Key, after the first
    caller gave up, sends it to Kafka again. Once the scheduler runs again both messages
    are read: one row, at the first attempt's received_at, and the late_answers view
    shows it stored after the API gave up. (A stopped scheduler would not do: once its
    reports are stale the API answers 503 at once, as it should.)"""
    system.wait_until_serving("sim")
    group = system.procs["scheduler"].pid
    key = f"late-{uuid.uuid4().hex}"
    body = {"model": "sim", "input": "late one", "timeout_ms": 1000}
    headers = {**system.headers(), "Idempotency-Key": key}
    os.killpg(group, signal.SIGSTOP)
    try:
        first = httpx.post(f"{system.url}/v1/infer", headers=headers, json=body, timeout=10)
        assert first.status_code == 504, first.text
        rid = first.json()["error"]["message"].rsplit("/", 1)[-1]
        # The retry waits long enough for the scheduler to run again: it is sent to
        # Kafka again, since the first attempt's deadline has passed.
        with ThreadPoolExecutor(1) as pool:
            retry = pool.submit(
                httpx.post,
                f"{system.url}/v1/infer",
                headers=headers,
                json={**body, "timeout_ms": 60_000},
                timeout=90,
            )
            time.sleep(1)  # the retry is in Kafka before the scheduler runs again
            os.killpg(group, signal.SIGCONT)
            second = retry.result()
    finally:
        os.killpg(group, signal.SIGCONT)
    # The retry is answered from the one row: the first attempt's, which the scheduler
    # found past its deadline when it ran again.
    assert second.status_code == 504, (second.status_code, second.text)
    assert second.json()["error"]["code"] == "deadline_exceeded"

    def late() -> Any:
        with engine.connect() as conn:
            return conn.execute(
                text(
                    "SELECT stored, late_by_ms, received_at FROM late_answers WHERE request_id = :r"
                ),
                {"r": rid},
            ).first()

    _, late_by_ms, received_at = wait_for(lambda: (r := late()) and r[0] and r, 120)
    assert late_by_ms > 0
    time.sleep(2)  # the second message, read after the first, has been stored too
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT received_at FROM requests WHERE request_id = :r"), {"r": rid}
        ).all()
        sent = conn.execute(
            text("SELECT received_at FROM idempotency_keys WHERE key = :k"), {"k": key}
        ).scalar_one()
    assert [r[0] for r in rows] == [sent] == [received_at]
    system.wait_until_serving("sim")
