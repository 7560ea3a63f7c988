"""The model lifecycle end to end: the registry (CLI and admin API), workers loading what
it says (sha256 checked), pinning, a sticky canary, promote and rollback reaching two
API instances within 2 s, replay with a passing verdict required, retirement, and an
honest "loading" answer.

One system for the module with a model of its own (``lc-<run>``, the sim backend), so
the shared registry of the session's database is untouched for other tests. The tests
run in order and build on each other's versions.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from core.models.sim import sim_output
from gristmill.devservices.stack import Services, System, build_system
from ingest.acceptance.routing import bucket
from results.db import make_engine
from results.modelregistry import readiness_stmt
from results.schema import requests
from results.tenants import get_tenant, issue_key
from tests.e2e.model_cli import models_cli, switch_time

pytestmark = pytest.mark.slow
NAME = f"lc-{uuid.uuid4().hex[:6]}"


class LC:
    def __init__(self, system: System, urls: list[str], admin_key: str):
        self.system = system
        self.urls = urls
        self.admin_key = admin_key

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return models_cli(self.system.env, *args, check=check, timeout_s=300)

    def infer(
        self, model: str, text: str, *, tier: str = "paid", url: str | None = None, **headers: str
    ) -> httpx.Response:
        return httpx.post(
            f"{url or self.urls[0]}/v1/infer",
            json={"model": model, "input": text},
            headers={**self.system.headers(tier), **headers},
            timeout=30,
        )

    def admin(self, method: str, path: str, key: str | None = None, **kw: Any) -> httpx.Response:
        key = self.admin_key if key is None else key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.request(
            method, f"{self.urls[0]}/v1/admin{path}", headers=headers, timeout=30, **kw
        )

    def until_ok(self, model: str, text: str, timeout_s: float = 60) -> httpx.Response:
        deadline = time.time() + timeout_s
        while True:
            r = self.infer(model, text)
            if r.status_code == 200 or time.time() > deadline:
                return r
            time.sleep(0.2)


@pytest.fixture(scope="module")
def lc(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LC]:
    workdir: Path = tmp_path_factory.mktemp("lifecycle")
    system = build_system(services, workdir, sim_batch_ms=20)
    with make_engine(system.settings.database_url).begin() as conn:
        tenant = get_tenant(conn, f"enterprise-{system.env['GRISTMILL_TOPIC_PREFIX'][8:]}")
        admin_key = issue_key(conn, tenant, admin=True)[1]
    try:
        lc = LC(system, [], admin_key)
        lc.cli("register", f"{NAME}@1", "--backend", "sim", "--config", '{"batch_ms": 20}')
        lc.cli("promote", f"{NAME}@1")
        system.start_scheduler(workers=2, models=f"sim,{NAME}")
        lc.urls = [system.start_api("api-a"), system.start_api("api-b")]
        system.url = lc.urls[0]
        system.wait_until_serving(NAME)
        yield lc
    finally:
        system.close()


def test_the_live_version_answers_and_a_pin_reaches_a_staged_one(lc: LC) -> None:
    r = lc.infer(NAME, "alpha")
    assert r.status_code == 200, r.text
    assert r.json()["model_version"] == "1" and r.json()["output"] == sim_output("alpha")
    lc.cli(
        "register",
        f"{NAME}@2",
        "--backend",
        "sim",
        "--config",
        '{"batch_ms": 20, "variant": "two"}',
    )
    # Staged: loaded into free room, served when pinned.
    r = lc.until_ok(f"{NAME}@2", "beta")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model_version"] == "2" and body["output"] == sim_output("beta", variant="two")
    with make_engine(lc.system.settings.database_url).connect() as conn:
        row = conn.execute(
            select(requests.c.model, requests.c.model_version).where(
                requests.c.request_id == body["request_id"]
            )
        ).one()
    assert tuple(row) == (NAME, "2")
    catalog = httpx.get(f"{lc.urls[0]}/v1/models", headers=lc.system.headers("paid")).json()
    listed = {(m["model"], m["version"]): m for m in catalog["models"]}
    assert listed[(NAME, "2")]["state"] == "staged" and listed[(NAME, "1")]["state"] == "live"
    # gristmill-lm is seeded as a built-in live version like the others (no worker here).
    assert listed[("gristmill-lm", "1")]["state"] == "live"
    ids = {d["id"] for d in catalog["data"]}
    assert {NAME, f"{NAME}@1", f"{NAME}@2", "gristmill-lm@1"} <= ids
    # Without a key: the live versions only, and no tenant sees worker counts.
    public = httpx.get(f"{lc.urls[0]}/v1/models").json()
    assert {(m["model"], m["version"]) for m in public["models"] if m["model"] == NAME} == {
        (NAME, "1")
    }
    assert not any("workers" in m for m in public["models"] + catalog["models"])
    assert httpx.get(f"{lc.urls[0]}/v2/models/{NAME}").json()["versions"] == ["1"]
    hidden = httpx.get(f"{lc.urls[0]}/v2/models/{NAME}/versions/2")
    assert hidden.status_code == 404 and "API key" in hidden.text, hidden.text
    assert lc.infer(NAME, "gamma").json()["model_version"] == "1"  # unpinned stays on live
    # KServe v2 answers from the registry too: the model's open versions, the live one's
    # readiness, a pinned version's own.
    v2 = f"{lc.urls[0]}/v2/models/{NAME}"
    meta = httpx.get(v2, headers=lc.system.headers("paid")).json()
    assert meta["versions"] == ["1", "2"]
    ready = httpx.get(f"{v2}/versions/2/ready", headers=lc.system.headers("paid"))
    assert ready.status_code == 200 and ready.json()["version"] == "2", ready.text


def test_the_admin_api_takes_admin_keys_only(lc: LC) -> None:
    assert lc.admin("GET", "/models", key="").status_code == 401
    tenant_key = lc.system.keys["paid"]
    r = lc.admin("GET", "/models", key=tenant_key)
    assert r.status_code == 403 and "admin scope" in r.text
    r = lc.admin("GET", "/models")
    assert r.status_code == 200
    mine = {v["version"]: v for v in r.json()["versions"] if v["model"] == NAME}
    assert mine["1"]["state"] == "live" and mine["1"]["workers"]["ready"] == 2
    bad = lc.admin("POST", "/models", json={"model": "x", "backend": "sim", "max_batch_size": 4})
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "model"


def test_a_canary_share_is_sticky_per_tenant(lc: LC) -> None:
    r = lc.admin("POST", f"/models/{NAME}/versions/2/canary", json={"share": 0.5})
    assert r.status_code == 200, r.text
    time.sleep(1.5)  # every API instance has re-read the routes
    for tier, tenant_id in lc.system.tenant_ids.items():
        expect = "2" if bucket(NAME, "2", f"tenant\x00{tenant_id}") < 0.5 else "1"
        got = {
            lc.infer(NAME, f"{tier} {i}", tier=tier, url=lc.urls[i % 2]).json()["model_version"]
            for i in range(8)
        }
        assert got == {expect}, (tier, got)
    audit = lc.admin("GET", f"/models/{NAME}/audit").json()["audit"]
    canary = next(a for a in audit if a["action"] == "canary")
    assert canary["actor"].startswith("key gm_") and canary["detail"]["share"] == 0.5
    assert (
        lc.admin("POST", f"/models/{NAME}/versions/2/canary", json={"share": 2}).status_code == 422
    )


def _switch_time(lc: LC, version: str, since: float) -> float:
    """Seconds from ``since`` until both API instances answer unpinned with ``version``."""

    def answered_by(url: str) -> str:
        r = lc.infer(NAME, "switch", tier="free", url=url)
        assert r.status_code == 200, r.text  # nothing errs meanwhile
        return str(r.json()["model_version"])

    return switch_time(answered_by, lc.urls, version, since)


def test_promote_and_rollback_reach_every_api_instance_within_2s(lc: LC) -> None:
    lc.cli("promote", f"{NAME}@2")
    t = time.time()
    assert _switch_time(lc, "2", t) <= 2.0
    r = lc.cli("rollback", NAME)
    assert "rollback" in r.stdout
    t = time.time()
    assert _switch_time(lc, "1", t) <= 2.0
    listed = lc.cli("list", NAME).stdout
    assert "(rollback target)" in listed


def test_replay_compares_and_a_promote_can_require_a_pass(lc: LC, tmp_path: Path) -> None:
    for i in range(30):  # recorded traffic on the live version
        assert lc.infer(NAME, f"recorded {i}", tier=("free", "paid")[i % 2]).status_code == 200
    r = lc.cli(
        "replay", "--candidate", f"{NAME}@2", "--since", "1h", "--baseline", "1", check=False
    )
    assert r.returncode == 2, r.stdout + r.stderr  # variant "two" answers differently
    assert "FAILED" in r.stdout and "agreement 0.00%" in r.stdout
    r = lc.cli("promote", f"{NAME}@2", "--require-replay", check=False)
    assert r.returncode == 1 and "no passing replay" in r.stderr
    lc.cli("register", f"{NAME}@3", "--backend", "sim", "--config", '{"batch_ms": 20}')
    chart = tmp_path / "replay.png"
    r = lc.cli(
        "replay",
        "--candidate",
        f"{NAME}@3",
        "--since",
        "1h",
        "--baseline",
        "1",
        "--chart",
        str(chart),
        "--out",
        str(tmp_path / "replay.json"),
    )
    assert "PASSED" in r.stdout and "free" in r.stdout and "paid" in r.stdout
    assert chart.stat().st_size > 10_000
    lc.cli("promote", f"{NAME}@3", "--require-replay")
    t = time.time()
    assert _switch_time(lc, "3", t) <= 2.0


def test_a_retired_version_is_drained_unloaded_and_refused(lc: LC) -> None:
    lc.cli("retire", f"{NAME}@2")
    deadline = time.time() + 3
    while lc.infer(f"{NAME}@2", "late").status_code != 404:
        assert time.time() < deadline
        time.sleep(0.1)
    assert "retired" in lc.infer(f"{NAME}@2", "late").json()["error"]["message"]
    v2 = f"{lc.urls[0]}/v2/models/{NAME}"
    gone = httpx.get(f"{v2}/versions/2", headers=lc.system.headers("paid"))
    assert gone.status_code == 404 and f"{NAME}@2" in gone.text, gone.text
    open_versions = httpx.get(v2, headers=lc.system.headers("paid")).json()["versions"]
    assert "2" not in open_versions and "1" in open_versions, open_versions
    listed = httpx.get(f"{lc.urls[0]}/v1/models", headers=lc.system.headers("paid"))
    ids = {d["id"] for d in listed.json()["data"]}
    assert f"{NAME}@2" not in ids and f"{NAME}@1" in ids
    engine = make_engine(lc.system.settings.database_url)
    prefix = lc.system.env["GRISTMILL_TOPIC_PREFIX"]
    deadline = time.time() + 15
    while True:
        with engine.connect() as conn:
            versions = {r.version for r in conn.execute(readiness_stmt(prefix)) if r.name == NAME}
        if "2" not in versions:
            break
        assert time.time() < deadline, versions
        time.sleep(0.5)


def test_a_digest_mismatch_never_serves(lc: LC, tmp_path: Path) -> None:
    weights = tmp_path / "weights.bin"
    weights.write_bytes(os.urandom(1000))
    wrong = hashlib.sha256(b"something else").hexdigest()
    r = lc.admin(
        "POST",
        "/models",
        json={
            "model": f"{NAME}@4",
            "backend": "sim",
            "max_batch_size": 8,
            "artifact": str(weights),
            "sha256": wrong,
        },
    )
    assert r.status_code == 201, r.text
    deadline = time.time() + 20
    while True:
        r = lc.infer(f"{NAME}@4", "never")
        assert r.status_code != 200, "a version whose digest does not match served"
        if "failed to load" in r.text:
            break
        assert time.time() < deadline, r.text
        time.sleep(0.3)
    # Tenants hear that it failed; why (paths, digests, upstream URLs) is for operators.
    assert r.status_code == 503 and wrong not in r.text and str(weights) not in r.text
    listed = lc.cli("list", NAME).stdout
    assert "failed" in listed and "sha256 mismatch" in listed and wrong in listed


def test_a_loading_version_is_a_503_with_retry_after_until_it_serves(lc: LC) -> None:
    lc.cli(
        "register", f"{NAME}@5", "--backend", "sim", "--config", '{"batch_ms": 20, "load_ms": 4000}'
    )
    seen: list[tuple[int, str | None, str]] = []
    deadline = time.time() + 40
    while time.time() < deadline:
        r = lc.infer(f"{NAME}@5", "slow to load")
        seen.append((r.status_code, r.headers.get("Retry-After"), r.text[:120]))
        if r.status_code == 200:
            break
        time.sleep(0.25)
    assert seen[-1][0] == 200, seen[-5:]
    loading = [s for s in seen if s[0] == 503 and "loading" in s[2]]
    assert loading and all(s[1] for s in loading), seen[:5]


def test_the_admin_api_answers_hostile_input_with_a_4xx_naming_it(lc: LC) -> None:
    """Operator routes are reached only with an admin key, and a bad body or path gets a
    4xx that names the problem, never a 5xx; nothing is registered by a refused call."""
    tenant_key = lc.system.keys["paid"]
    ok = {"model": f"{NAME}@90", "backend": "sim", "max_batch_size": 8}
    assert lc.admin("GET", "/models", key="").status_code == 401
    forbidden = lc.admin("POST", "/models", key=tenant_key, json=ok)
    assert forbidden.status_code == 403, forbidden.text
    assert "admin" in forbidden.text
    cases: list[tuple[dict[str, Any] | None, bytes | None, str]] = [
        ({**ok, "model": f"{NAME}\x00@91"}, None, "model"),
        ({**ok, "max_batch_size": "many"}, None, "max_batch_size"),
        ({**ok, "max_batch_size": 10**9}, None, "max_batch_size"),
        ({**ok, "backend": "nonsense"}, None, "backend"),
        ({**ok, "surprise": 1}, None, "surprise"),
        (None, b"{not json", "body"),
    ]
    for body, raw, field in cases:
        r = (
            lc.admin("POST", "/models", json=body)
            if raw is None
            else lc.admin("POST", "/models", content=raw)
        )
        assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
        assert field in r.text, (field, r.text)
    huge = lc.admin("POST", "/models", json={**ok, "config": {"pad": "x" * 2_000_000}})
    assert huge.status_code == 413, huge.text
    for path in (f"/models/{NAME}%00/audit", "/models/nobody/rollback"):
        r = lc.admin("POST" if path.endswith("rollback") else "GET", path, json={})
        assert 400 <= r.status_code < 500, (path, r.status_code, r.text)
    listed = lc.admin("GET", "/models").json()
    assert not any(
        v.get("version") in ("90", "91") and v.get("model", v.get("name")) == NAME
        for v in listed.get("versions", [])
    ), listed
