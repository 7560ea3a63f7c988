"""Retries mean the same request across a rollout (held-out style): under load, every
request is sent and then retried with the same Idempotency-Key and body while a canary
starts and is rolled back; a retry is never refused and always answers what its first
attempt answered. And a retry that must be sent again goes to the version its first
attempt was routed to, whatever routing says by then.

One system with a model of its own (``rt-<run>``, the sim backend): version 1 live,
version 2 registered with another variant (so each answer says which version made it),
two API instances; the canary is started and rolled back through the admin API.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from core.messages import body_hash
from core.models.sim import sim_output
from gristmill.devservices.stack import Services, System, build_system
from results.db import make_engine
from results.tenants import get_tenant, issue_key

pytestmark = pytest.mark.slow
NAME = f"rt-{uuid.uuid4().hex[:6]}"
V2 = {"variant": "two"}


class RT:
    def __init__(self, system: System, urls: list[str], admin_key: str):
        self.system, self.urls, self.admin_key = system, urls, admin_key

    def infer(
        self, text_: str, key: str | None = None, url: str | None = None, model: str = NAME
    ) -> httpx.Response:
        headers = self.system.headers("paid")
        if key is not None:
            headers["Idempotency-Key"] = key
        return httpx.post(
            f"{url or self.urls[0]}/v1/infer",
            json={"model": model, "input": text_},
            headers=headers,
            timeout=30,
        )

    def admin(self, path: str, **body: Any) -> None:
        r = httpx.post(
            f"{self.urls[0]}/v1/admin/models/{NAME}{path}",
            json=body or None,
            headers={"Authorization": f"Bearer {self.admin_key}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text

    def routed(self, version: str, timeout_s: float = 5.0) -> None:
        """Until both instances route a new request of this tenant to ``version``."""
        deadline = time.time() + timeout_s
        for url in self.urls:
            while (v := self.infer("probe", url=url).json()["model_version"]) != version:
                assert time.time() < deadline, v
                time.sleep(0.05)


@pytest.fixture(scope="module")
def rt(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RT]:
    workdir: Path = tmp_path_factory.mktemp("retries")
    # About retries, not the overload guard (its tests: tests/e2e/test_policy.py and
    # tests/unit/ingest/admission/test_overload.py). On a 2-core box a moment of CPU
    # contention (the canary's reconfiguration, a JVM pause) lags an API's loop past
    # 100 ms and the guard sheds for a second; in one CI run that refused 40% of the
    # keys. Here it guards only against a stall the test would not survive anyway.
    guard = json.dumps({t: [2000.0, 5000.0] for t in ("free", "paid", "enterprise")})
    system = build_system(
        services,
        workdir,
        sim_batch_ms=20,
        extra_env={"GRISTMILL_LOOP_LAG_SHED_MS": guard, "GRISTMILL_ANSWER_DELAY_SHED_MS": guard},
    )
    with make_engine(system.settings.database_url).begin() as conn:
        tenant = get_tenant(conn, f"enterprise-{system.env['GRISTMILL_TOPIC_PREFIX'][8:]}")
        admin_key = issue_key(conn, tenant, admin=True)[1]
    try:
        r = RT(system, [], admin_key)
        r.urls = [system.start_api("api-a"), system.start_api("api-b")]
        system.url = r.urls[0]
        for version, config in (("1", {}), ("2", V2)):
            resp = httpx.post(
                f"{r.urls[0]}/v1/admin/models",
                json={
                    "model": f"{NAME}@{version}",
                    "backend": "sim",
                    "max_batch_size": 64,
                    "config": {"batch_ms": 20, **config},
                },
                headers={"Authorization": f"Bearer {admin_key}"},
                timeout=30,
            )
            assert resp.status_code == 201, resp.text
        r.admin("/versions/1/promote")
        system.start_scheduler(workers=2, models=f"sim,{NAME}")
        system.wait_until_serving(NAME)
        deadline = time.time() + 60  # version 2 loaded too (served when pinned)
        while r.infer("warm", model=f"{NAME}@2").status_code != 200:
            assert time.time() < deadline
            time.sleep(0.2)
        yield r
    finally:
        system.close()


def answer(r: httpx.Response) -> tuple[int, Any, Any, Any]:
    body = r.json()
    if r.status_code != 200:
        err = body.get("error", {})
        return r.status_code, err.get("code"), err.get("message"), None
    return 200, body["request_id"], body["model_version"], body["output"]


def test_retries_across_a_canary_start_and_a_rollback_under_load(rt: RT) -> None:
    rng = random.Random(7)
    rate, seconds = 40, 9.0  # keys a second (each sent twice: ~80 requests a second)
    n = int(rate * seconds)
    firsts: dict[int, tuple[int, Any, Any, Any]] = {}
    retries: dict[int, tuple[int, Any, Any, Any]] = {}
    t0 = time.monotonic() + 0.5
    run = uuid.uuid4().hex[:8]

    def client(i: int) -> None:
        time.sleep(max(0.0, t0 + i / rate - time.monotonic()))  # open loop
        key, text_ = f"held-out-{run}-{i}", f"retry me {run} {i}"
        firsts[i] = answer(rt.infer(text_, key, url=rt.urls[i % 2]))
        time.sleep(rng.uniform(0.05, 1.5))  # the routing may change meanwhile
        retries[i] = answer(rt.infer(text_, key, url=rt.urls[(i + 1) % 2]))

    def operator() -> None:
        time.sleep(0.5 + seconds / 3)
        rt.admin("/versions/2/canary", share=1.0)  # every tenant to version 2
        time.sleep(seconds / 3)
        rt.admin("/rollback", version="2")  # the canary withdrawn: back to version 1

    op = threading.Thread(target=operator)
    op.start()
    with ThreadPoolExecutor(max_workers=128) as pool:
        list(pool.map(client, range(n)))
    op.join()

    codes = Counter((firsts[i][0], retries[i][0]) for i in range(n))
    print(f"{n} keys, (first, retry) statuses: {dict(codes)}")
    # The finding: a retry with the same key and body answered 422 (9 times in one
    # held-out run at 200 req/s). Never, now.
    reused = [(i, firsts[i], retries[i]) for i in range(n) if 422 in (firsts[i][0], retries[i][0])]
    assert not reused, reused[:5]
    # A retry answers what its first attempt was answered (an expired request's 504
    # included), or its answer when the first attempt's wait ran out; the only other
    # outcome is this 2-core machine refusing before the key is looked at (503, "retry
    # shortly"), which must stay rare: its API shedding load, or admission refusing while
    # a commit of the API's own has stalled past what a deadline leaves (decision 39; one
    # CI run saw a 2.2 s stall refuse two retries).
    before_key = ("overload", "database takes")
    shed = [
        i
        for i in range(n)
        if retries[i][0] == 503 and any(w in str(retries[i][2]) for w in before_key)
    ]
    differ = [
        (i, firsts[i], retries[i])
        for i in range(n)
        if i not in shed and firsts[i] != retries[i] and firsts[i][0] == 200
    ]
    assert not differ, differ[:5]
    late = [(i, firsts[i], retries[i]) for i in range(n) if firsts[i][0] != 200 and i not in shed]
    assert all(r[0] in (200, 504) for _, _, r in late), late[:5]
    assert len(shed) + sum(firsts[i][0] == 503 for i in range(n)) <= n // 50, codes
    answered = [i for i in range(n) if firsts[i][0] == 200]
    versions = {firsts[i][2] for i in answered}
    assert versions == {"1", "2"}, versions  # the rollout did happen during the load
    for i in answered:  # and each answer is its version's own
        variant = V2 if firsts[i][2] == "2" else {}
        assert firsts[i][3] == sim_output(f"retry me {run} {i}", **variant)


def test_a_retry_sent_again_goes_to_the_version_its_first_attempt_was_routed_to(rt: RT) -> None:
    """The first attempt claimed its key while the canary (version 2) took this tenant,
    then died before Kafka had it; the canary is gone when the retry comes."""
    rt.routed("1")
    text_, key, rid = (
        f"lost first attempt {uuid.uuid4()}",
        f"lost-{uuid.uuid4()}",
        str(uuid.uuid4()),
    )
    now = datetime.now(UTC)
    engine = make_engine(rt.system.settings.database_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO idempotency_keys (tenant_id, key, request_id, body_hash, "
                "deadline_at, received_at, model_version) VALUES (:t, :k, :r, :h, :d, :rc, '2')"
            ),
            {
                "t": rt.system.tenant_ids["paid"],
                "k": key,
                "r": rid,
                "h": body_hash(NAME, text_, {}),  # what the caller sent, as the API hashes it
                "d": now - timedelta(seconds=1),  # its caller gave up: the retry resends
                "rc": now - timedelta(seconds=2),
            },
        )
    engine.dispose()
    r = rt.infer(text_, key)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["request_id"] == rid and body["model_version"] == "2"
    assert body["output"] == sim_output(text_, **V2)
    fresh = rt.infer(f"a new one {uuid.uuid4()}", f"new-{uuid.uuid4()}")
    assert fresh.json()["model_version"] == "1"  # new requests go where routing says
    again = rt.infer(text_, key, url=rt.urls[1])  # and the retry of the retry: its answer
    assert answer(again) == answer(r)
