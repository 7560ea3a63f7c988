"""Re-embed on promote (issue 34 item 2, decision 68) over real HTTP, Kafka and
PostgreSQL, with two embedding versions that give different vectors (``sim`` in vector
mode; version 2 a variant): the gate refuses a promote with a corpus until a replay
passed, a tenant's corpus is never another's, a promote with a corpus starts a migration
job at backfill priority, pinned reads keep answering the old vectors while it runs,
the old version cannot be retired before coverage is 100%, coverage reaches 100%
(job API, admin API, /metrics), every output of the migration comes from the new
version, and a request-log window is a corpus too (through the CLI).

One system for the module with a model of its own; the tests run in order.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import select

from core.models.sim import sim_vectors
from gristmill.devservices.stack import Services, System, build_system
from results.db import make_engine
from results.schema import requests
from results.tenants import get_tenant, issue_key
from tests.e2e.model_cli import models_cli

pytestmark = pytest.mark.slow
NAME = f"re-{uuid.uuid4().hex[:6]}"
DIM = 8
CORPUS = [f"document {i}" for i in range(160)]
LOGGED = [f"query {i % 12}" for i in range(30)]  # 12 distinct inputs, some sent again
V1 = {"batch_ms": 20, "vector_dim": DIM}
# Slow on purpose (4 items a batch, 200 ms each: ~4 s for the corpus on two workers),
# so the migration is certainly under way when the test reads and retires meanwhile.
V2 = {"batch_ms": 200, "vector_dim": DIM, "variant": "two"}


def old(text: str) -> np.ndarray:
    return sim_vectors([text], "", DIM)[0]


def new(text: str) -> np.ndarray:
    return sim_vectors([text], "two\x00", DIM)[0]


class RE:
    def __init__(self, system: System, admin_key: str):
        self.s = system
        self.admin_key = admin_key
        self.run = system.env["GRISTMILL_TOPIC_PREFIX"][8:]
        self.corpus_job = ""

    def tenant(self, tier: str) -> str:
        return f"{tier}-{self.run}"

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return models_cli(self.s.env, *args, check=check, timeout_s=300)

    def admin(self, method: str, path: str, key: str | None = None, **kw: Any) -> httpx.Response:
        key = self.admin_key if key is None else key
        return httpx.request(
            method,
            f"{self.s.url}/v1/admin{path}",
            headers={"Authorization": f"Bearer {key}"},
            timeout=120,
            **kw,
        )

    def infer(self, model: str, text: str, tier: str = "paid") -> httpx.Response:
        return httpx.post(
            f"{self.s.url}/v1/infer",
            json={"model": model, "input": text},
            headers=self.s.headers(tier),
            timeout=30,
        )

    def job(self, job_id: str, tier: str = "paid") -> dict[str, Any]:
        r = httpx.get(f"{self.s.url}/v1/jobs/{job_id}", headers=self.s.headers(tier), timeout=30)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def wait_done(self, job_id: str, tier: str = "paid") -> dict[str, Any]:
        deadline = time.time() + 180
        while True:
            j = self.job(job_id, tier)
            if j["finished_at"]:
                return j
            assert time.time() < deadline, j
            time.sleep(0.3)

    def results(self, job_id: str, tier: str = "paid") -> list[dict[str, Any]]:
        r = httpx.get(
            f"{self.s.url}/v1/jobs/{job_id}/results", headers=self.s.headers(tier), timeout=120
        )
        assert r.status_code == 200, r.text
        return [httpx.Response(200, content=line).json() for line in r.content.splitlines()]

    def live(self) -> str:
        listed = self.admin("GET", "/models").json()["versions"]
        return next(v["version"] for v in listed if v["model"] == NAME and v["state"] == "live")

    def migrations(self) -> list[dict[str, Any]]:
        r = self.admin("GET", f"/models/{NAME}/migrations")
        assert r.status_code == 200, r.text
        return list(r.json()["migrations"])


@pytest.fixture(scope="module")
def re(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RE]:
    workdir: Path = tmp_path_factory.mktemp("reembed")
    system = build_system(services, workdir, sim_batch_ms=20)
    run = system.env["GRISTMILL_TOPIC_PREFIX"][8:]
    with make_engine(system.settings.database_url).begin() as conn:
        admin_key = issue_key(conn, get_tenant(conn, f"enterprise-{run}"), admin=True)[1]
    try:
        r = RE(system, admin_key)
        r.cli("register", f"{NAME}@1", "--backend", "sim", "--config", _json(V1))
        r.cli("promote", f"{NAME}@1")
        r.cli(
            "register", f"{NAME}@2", "--backend", "sim", "--config", _json(V2), "--max-batch", "4"
        )
        system.start_scheduler(workers=2, models=f"sim,{NAME}")
        system.url = system.start_api()
        system.wait_until_serving(NAME)
        yield r
    finally:
        system.close()


def _json(x: dict[str, Any]) -> str:
    return json.dumps(x)


def test_a_corpus_is_embedded_by_the_live_version(re: RE) -> None:
    body = {
        "model": NAME,
        "items": [{"custom_id": f"c{i}", "input": x} for i, x in enumerate(CORPUS)],
    }
    r = httpx.post(f"{re.s.url}/v1/jobs", json=body, headers=re.s.headers(), timeout=120)
    assert r.status_code == 202, r.text
    re.corpus_job = r.json()["job_id"]
    assert re.wait_done(re.corpus_job)["status"] == "completed"
    got = re.results(re.corpus_job)
    assert np.allclose(got[5]["output"], old(CORPUS[5]))
    for text in LOGGED:  # sync traffic: the replay's sample and a request-log corpus
        a = re.infer(NAME, text)
        assert a.status_code == 200, a.text
        assert np.allclose(a.json()["output"], old(text))
    # Version 2 is staged: a pin reaches it, and it gives other vectors.
    deadline = time.time() + 60
    while (b := re.infer(f"{NAME}@2", "probe")).status_code != 200:
        assert time.time() < deadline, b.text
        time.sleep(0.3)
    assert np.allclose(b.json()["output"], new("probe"))
    assert not np.allclose(new("probe"), old("probe"))


def test_the_gate_refuses_a_re_embed_until_a_replay_passed(re: RE) -> None:
    corpus = {"tenant": re.tenant("paid"), "job_id": re.corpus_job}
    r = re.admin("POST", f"/models/{NAME}/versions/2/promote", json={"corpus": corpus})
    assert r.status_code == 409, r.text
    assert "no passing replay" in r.text
    # Vectors of another space do not agree with the old ones: the default replay fails.
    rp = re.cli("replay", "--candidate", f"{NAME}@2", "--since", "1h", check=False)
    assert rp.returncode == 2, rp.stdout + rp.stderr
    paid = re.tenant("paid")
    c = re.cli(
        "promote", f"{NAME}@2", "--corpus-tenant", paid, "--corpus-job", re.corpus_job, check=False
    )
    assert c.returncode == 1 and "no passing replay" in c.stderr
    assert re.live() == "1" and re.migrations() == []  # a refusal changed nothing


def test_a_tenant_never_migrates_another_tenants_corpus(re: RE) -> None:
    # A model in a new vector space is gated on its errors and latency, not agreement.
    rp = re.cli("replay", "--candidate", f"{NAME}@2", "--since", "1h", "--min-agreement", "0")
    assert "PASSED" in rp.stdout
    for tier in ("free", "enterprise"):  # the paid tenant's job named as theirs
        corpus = {"tenant": re.tenant(tier), "job_id": re.corpus_job}
        r = re.admin("POST", f"/models/{NAME}/versions/2/promote", json={"corpus": corpus})
        assert r.status_code == 404, r.text
        assert r.json()["error"]["field"] == "corpus.job_id"
    r = re.admin(
        "POST",
        f"/models/{NAME}/versions/2/promote",
        json={"corpus": {"tenant": "nobody-" + re.run, "job_id": re.corpus_job}},
    )
    assert r.status_code == 404 and r.json()["error"]["field"] == "corpus.tenant"
    # A tenant's own key reaches none of it.
    r = re.admin("GET", f"/models/{NAME}/migrations", key=re.s.keys["paid"])
    assert r.status_code == 403
    assert re.live() == "1" and re.migrations() == []


def test_promote_with_a_corpus_re_embeds_it_while_pinned_reads_keep_the_old_vectors(
    re: RE,
) -> None:
    corpus = {"tenant": re.tenant("paid"), "job_id": re.corpus_job}
    r = re.admin("POST", f"/models/{NAME}/versions/2/promote", json={"corpus": corpus})
    assert r.status_code == 200, r.text
    m = r.json()["migration"]
    assert (m["from_version"], m["to_version"], m["items"]) == ("1", "2", len(CORPUS))
    job_id = m["job_id"]

    # Under way: the old version may not be retired, and pinned reads answer its vectors.
    r = re.admin("POST", f"/models/{NAME}/versions/1/retire")
    assert r.status_code == 409, r.text
    assert job_id in r.text and "covered" in r.text
    seen: list[float] = []
    while not (j := re.job(job_id))["finished_at"]:
        seen.append(j["migration"]["coverage"])
        pinned = re.infer(f"{NAME}@1", LOGGED[len(seen) % len(LOGGED)])
        assert pinned.status_code == 200, pinned.text
        assert pinned.json()["model_version"] == "1"
        assert np.allclose(pinned.json()["output"], old(LOGGED[len(seen) % len(LOGGED)]))
        unpinned = re.infer(NAME, "after the promote")
        assert unpinned.json()["model_version"] == "2"
        time.sleep(0.2)
    assert seen and seen[0] < 1.0 and seen == sorted(seen)  # it grew, never fell back

    done = re.job(job_id)
    assert done["status"] == "completed" and done["model_version"] == "2"
    assert done["migration"]["coverage"] == 1.0 and done["migration"]["state"] == "complete"
    # One answer, one version: the whole migration's output is version 2's, in the
    # corpus's order with its custom ids; the corpus job's own answers are untouched.
    got = re.results(job_id)
    assert [x["custom_id"] for x in got] == [f"c{i}" for i in range(len(CORPUS))]
    for x, text in zip(got, CORPUS, strict=True):
        assert np.allclose(x["output"], new(text)), x
    assert np.allclose(re.results(re.corpus_job)[7]["output"], old(CORPUS[7]))
    with make_engine(re.s.settings.database_url).connect() as conn:
        rows = conn.execute(
            select(requests.c.model_version, requests.c.priority, requests.c.tenant_id).where(
                requests.c.job_id == job_id
            )
        ).all()
    assert len(rows) == len(CORPUS)
    assert {tuple(r) for r in rows} == {("2", "jobs", re.s.tenant_ids["paid"])}  # backfill

    # After the cut-over the next incremental refresh names the migration as its base.
    refreshed = [f"{x} edited" if i in (3, 50, 99) else x for i, x in enumerate(CORPUS)]
    body = {"model": NAME, "base_job_id": job_id, "items": [{"input": x} for x in refreshed]}
    r = httpx.post(f"{re.s.url}/v1/jobs", json=body, headers=re.s.headers(), timeout=120)
    assert r.status_code == 202, r.text
    assert r.json()["usage"]["reused_items"] == len(CORPUS) - 3
    assert re.job(r.json()["job_id"])["migration"] is None  # an ordinary job

    listed = re.migrations()
    assert [x["job_id"] for x in listed] == [job_id] and listed[0]["coverage"] == 1.0
    deadline = time.time() + 30  # the API reads the gauges every 10 s
    while True:
        text = httpx.get(f"{re.s.url}/metrics", timeout=10).text
        line = f'gristmill_version_coverage{{model="{NAME}",version="2"}} 1.0'
        if line in text:
            break
        assert time.time() < deadline, [x for x in text.splitlines() if "coverage" in x]
        time.sleep(1)


def test_a_request_log_window_is_a_corpus_through_the_cli(re: RE) -> None:
    since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    window = ("--corpus-since", since)
    r = re.cli("migrate", f"{NAME}@2", "--corpus-tenant", re.tenant("free"), *window, check=False)
    assert r.returncode == 1 and "holds no items" in r.stderr  # free sent nothing
    r = re.cli("migrate", f"{NAME}@2", "--corpus-tenant", re.tenant("paid"), *window)
    job_id = r.stdout.strip().rsplit("job ", 1)[1]
    done = re.wait_done(job_id)
    assert done["migration"]["corpus"]["kind"] == "log"
    got = re.results(job_id)
    # Each input once, in the order first sent: the stack's "warm up" at start, then ours.
    distinct = ["warm up", *dict.fromkeys(LOGGED)]
    assert len(got) == len(distinct)
    for x, text in zip(got, distinct, strict=True):
        assert x["custom_id"] is None and np.allclose(x["output"], new(text)), (x, text)
    assert "100.0%" in re.cli("migrations", NAME).stdout
    # Every corpus moved: the old version may go.
    retired = re.admin("POST", f"/models/{NAME}/versions/1/retire")
    assert retired.status_code == 200, retired.text
