"""Device time per tenant (decision 65), as operators and analysts read it: the scheduler's
Prometheus text over real HTTP, and the analysts' functions in real PostgreSQL, after real
requests of two tenants of one tier went through Kafka, the scheduler and a worker."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from gristmill.devservices import free_port
from gristmill.devservices.stack import Services, System, build_system
from results.db import make_engine
from results.tenants import create_tenant, issue_key

N = 24


@pytest.fixture(scope="module")
def metered(
    services: Services, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[System, int]]:
    system = build_system(services, tmp_path_factory.mktemp("device-time"))
    port = free_port()
    try:
        system.start_scheduler(env={"GRISTMILL_METRICS_PORT": str(port)})
        system.url = system.start_api()
        system.wait_until_serving("sim")
        yield system, port
    finally:
        system.close()


def paid(system: System) -> tuple[str, str]:
    with make_engine(system.settings.database_url).begin() as conn:
        t = create_tenant(conn, f"dt-{uuid.uuid4().hex[:8]}", "paid")
        return t.id, issue_key(conn, t)[1]


@pytest.fixture(scope="module")
def ran(metered: tuple[System, int]) -> dict[str, str]:
    """Two paid tenants, one of one-word inputs and one of 200-word inputs, at once."""
    system, _ = metered
    tenants = {"terse": paid(system), "verbose": paid(system)}
    words = {"terse": 1, "verbose": 200}

    def send(job: tuple[str, int]) -> int:
        name, i = job
        r = httpx.post(
            f"{system.url}/v1/infer",
            json={"model": "sim", "input": " ".join([f"{name}{i}"] * words[name])},
            headers={"Authorization": f"Bearer {tenants[name][1]}"},
            timeout=30,
        )
        return r.status_code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(send, [(n, i) for i in range(N) for n in tenants]))
    assert codes == [200] * (2 * N)
    return {name: tid for name, (tid, _) in tenants.items()}


def test_prometheus_shows_each_tenants_device_seconds_shares_and_the_tier_index(
    metered: tuple[System, int], ran: dict[str, str]
) -> None:
    _, port = metered
    body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    samples = [s for f in text_string_to_metric_families(body) for s in f.samples]

    def value(name: str, **labels: str) -> float:
        got = [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]
        assert len(got) == 1, (name, labels, got)
        return got[0]

    for tid in ran.values():
        assert value("gristmill_tenant_device_seconds", **{"class": "paid"}, tenant=tid) > 0
        assert value("gristmill_tenant_entitled_device_seconds", tenant=tid) > 0
        for kind in ("received", "entitled"):
            assert 0 < value("gristmill_tenant_device_share", tenant=tid, kind=kind) <= 1
    # a one-word input is charged less of each batch than a 200-word one
    terse, verbose = (
        value("gristmill_tenant_device_seconds", tenant=ran[n]) for n in ("terse", "verbose")
    )
    assert terse < verbose
    index = value("gristmill_fairness_index", **{"class": "paid"})
    assert 0 < index <= 1


def test_the_analysts_views_add_up_to_the_batches_measured_time(
    metered: tuple[System, int], ran: dict[str, str]
) -> None:
    system, _ = metered
    ids = list(ran.values())
    with make_engine(system.settings.database_url).connect() as conn:
        rows = conn.execute(
            text(
                "SELECT tenant_id, tenant, received_s, entitled_s, received_share, entitled_share"
                " FROM device_time_by_minute(now() - interval '1 hour', now())"
                " WHERE tier = 'paid' AND tenant_id = ANY(:ids)"
            ),
            {"ids": ids},
        ).all()
        assert {r.tenant_id for r in rows} == set(ids)
        assert all(r.received_s > 0 and r.entitled_s > 0 and r.tenant for r in rows)
        assert all(0 < r.received_share <= 1 and 0 < r.entitled_share <= 1 for r in rows)
        # what the tenants' batches measured is what the view shares out
        measured, shared = conn.execute(
            text(
                "SELECT sum(b.compute_ms) / 1000, sum(s.total) / 1000 FROM batches b"
                " CROSS JOIN LATERAL (SELECT sum((t.value ->> 0)::float8) AS total"
                "   FROM jsonb_each(b.shares -> 'paid') t) s"
                " WHERE b.shares -> 'paid' ?| CAST(:ids AS text[])"
            ),
            {"ids": ids},
        ).one()
        assert shared == pytest.approx(measured, rel=1e-3)
        index = conn.execute(
            text(
                "SELECT min(fairness_index), max(fairness_index)"
                " FROM fairness_by_minute(now() - interval '1 hour', now()) WHERE tier = 'paid'"
            )
        ).one()
        assert 0 < index[0] <= index[1] <= 1 + 1e-9
        assert not math.isnan(index[1])
