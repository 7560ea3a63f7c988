"""Tier policy over the real system: rate limits, shedding by tier, fairness."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid

import aiohttp
import httpx

from gristmill.devservices.stack import System
from results.db import make_engine
from results.tenants import create_tenant, issue_key, set_plan


def new_tenant(system: System, tier: str, **plan: float) -> str:
    with make_engine(system.settings.database_url).begin() as conn:
        name = f"{tier}-{uuid.uuid4().hex[:8]}"
        t = create_tenant(conn, name, tier)
        if plan:
            set_plan(conn, name, **plan)  # type: ignore[arg-type]
        return issue_key(conn, t)[1]


def test_rate_limit_answers_429_with_retry_after_and_ratelimit_headers(system: System) -> None:
    key = new_tenant(system, "paid", rate_rps=1, burst=2)
    rs = [
        httpx.post(
            f"{system.url}/v1/infer",
            json={"model": "sim", "input": f"r{i}"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        for i in range(6)
    ]
    assert rs[0].status_code == 200
    assert {"ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"} <= set(rs[0].headers)
    limited = [r for r in rs if r.status_code == 429]
    assert limited, [r.status_code for r in rs]
    r = limited[0]
    assert int(r.headers["Retry-After"]) >= 1 and r.headers["RateLimit-Remaining"] == "0"
    assert r.json()["error"]["code"] == "rate_limited"


def test_overload_sheds_free_first_with_retry_after(system: System) -> None:
    # Thresholds that make any free traffic "too late" while paid still fits.
    url = system.start_api(
        "api-shedding",
        env={"GRISTMILL_SHED_DELAY_MS": json.dumps({"free": -1, "paid": 600, "enterprise": 2000})},
    )
    try:
        time.sleep(2.5)  # the instance reads the schedulers' load reports once a second
        free = httpx.post(
            f"{url}/v1/infer",
            json={"model": "sim", "input": "x"},
            headers=system.headers("free"),
            timeout=30,
        )
        paid = httpx.post(
            f"{url}/v1/infer",
            json={"model": "sim", "input": "x"},
            headers=system.headers("paid"),
            timeout=30,
        )
        assert free.status_code == 503 and int(free.headers["Retry-After"]) >= 1
        assert "overloaded" in free.json()["error"]["message"]
        assert paid.status_code == 200
    finally:
        system.stop("api-shedding")


def test_a_noisy_tenant_cannot_push_a_quiet_one_past_its_slo(system: System) -> None:
    big = {"rate_rps": 1e6, "burst": 1e6}
    noisy, quiet = new_tenant(system, "paid", **big), new_tenant(system, "paid", **big)
    # No shedding here: this test is about sharing, not about admission.
    url = system.start_api(
        "api-fair",
        env={"GRISTMILL_SHED_DELAY_MS": json.dumps({"free": 1e9, "paid": 1e9, "enterprise": 1e9})},
    )

    async def run() -> tuple[list[float], list[float]]:
        # Separate client pools: the quiet tenant must not queue behind the noisy one's
        # connections on our side; 1,000 connections keep the server's backlog deep.
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1000)) as ns,
            aiohttp.ClientSession() as qs,
        ):

            async def call(s: aiohttp.ClientSession, key: str, i: int) -> float:
                t = time.perf_counter()
                async with s.post(
                    f"{url}/v1/infer",
                    json={"model": "sim", "input": f"f{i}", "timeout_ms": 60000},
                    headers={"Authorization": f"Bearer {key}"},
                ) as r:
                    assert r.status == 200, await r.text()
                    await r.read()
                return time.perf_counter() - t

            burst = [asyncio.create_task(call(ns, noisy, i)) for i in range(2000)]
            await asyncio.sleep(0.5)  # the burst is queued
            quiet_lat = []
            for i in range(10):
                quiet_lat.append(await call(qs, quiet, i))
            return list(await asyncio.gather(*burst)), quiet_lat

    try:
        noisy_lat, quiet_lat = asyncio.run(run())
    finally:
        system.stop("api-fair")
    # The burst waits its turn (seconds); the quiet tenant's requests ride in the next
    # batches: well under the burst's median wait.
    assert max(quiet_lat) < statistics.median(noisy_lat), (quiet_lat, statistics.median(noisy_lat))
    assert statistics.median(quiet_lat) < 1.0
