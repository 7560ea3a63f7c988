"""Tier policy over the real system: rate limits, shedding by tier, fairness."""

from __future__ import annotations

import json
import signal
import statistics
import time
import uuid
from collections.abc import Callable

import httpx

from gristmill.devservices.stack import System
from results.db import make_engine
from results.load import live_instances_stmt, live_reports_stmt
from results.tenants import create_tenant, issue_key, set_plan
from tests.e2e.backlog import burst_into_kafka, done_count, new_tenant_id, queued_paid


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


def quiet_requests(
    url: str, headers: dict[str, str], burst_done: Callable[[], int]
) -> tuple[list[float], int]:
    """Ten requests one after another, each with a deadline long enough to be admitted
    whatever is queued (these tests are about sharing, not admission): their latencies
    (s), and ``burst_done()`` read after the fifth."""
    latencies: list[float] = []
    done = -1
    for i in range(10):
        t = time.perf_counter()
        r = httpx.post(
            f"{url}/v1/infer",
            json={"model": "sim", "input": f"q{i}", "timeout_ms": 60000},
            headers=headers,
            timeout=60,
        )
        assert r.status_code == 200, r.text
        latencies.append(time.perf_counter() - t)
        if i == 4:
            done = burst_done()
    return latencies, done


def test_a_noisy_tenant_cannot_push_a_quiet_one_past_its_slo(system: System) -> None:
    """A burst of 4,000 requests (2 s of capacity) from one paid tenant is put straight
    into Kafka, as API instances would after accepting it. A quiet paid tenant's
    requests must still be answered promptly, riding in the next batches, while the
    burst drains."""
    quiet = new_tenant(system, "paid", rate_rps=1e6, burst=1e6)
    # This test is about sharing, not admission: the quiet requests carry a deadline
    # long enough to be admitted whatever is queued.
    url = system.start_api("api-fair")
    warm = httpx.post(
        f"{url}/v1/infer",
        json={"model": "sim", "input": "warm"},
        headers={"Authorization": f"Bearer {quiet}"},
        timeout=60,
    )
    assert warm.status_code == 200
    noisy_id = str(uuid.uuid4())
    burst_into_kafka(system, noisy_id, 4000)
    try:
        quiet_lat, noisy_done = quiet_requests(
            url, {"Authorization": f"Bearer {quiet}"}, lambda: done_count(system, noisy_id)
        )
    finally:
        system.stop("api-fair")
    # The burst is still draining while the quiet tenant is served within its SLO.
    # The first quiet request may sit behind the burst inside a Kafka partition (FIFO);
    # from then on the scheduler's round robin serves the quiet tenant in every batch.
    assert statistics.median(quiet_lat[1:]) < 1.0, (quiet_lat, noisy_done)
    assert noisy_done >= 0
    # Leave no backlog behind for the tests that follow (it would make them shed).
    deadline = time.time() + 120
    while time.time() < deadline and done_count(system, noisy_id) < 4000:
        time.sleep(0.5)
    assert done_count(system, noisy_id) == 4000
    time.sleep(3)  # and the API instances' view of the backlog has caught up


def test_a_bursting_flow_cannot_starve_the_other_flows_of_its_own_tenant(system: System) -> None:
    """Behind an inference gateway, one end user of a paid key (fairness id "burst")
    sends 8,000 requests (4 s of capacity), put straight into Kafka as API instances
    would after accepting them. Another user of the same key (fairness id "quiet") sends
    requests through the API with the gateway's header: they are answered promptly,
    while the burst is still draining, instead of waiting behind it in the tenant's turn
    (decision 58)."""
    with make_engine(system.settings.database_url).begin() as conn:
        name = f"paid-{uuid.uuid4().hex[:8]}"
        tenant = create_tenant(conn, name, "paid")
        set_plan(conn, name, rate_rps=1e6, burst=1e6)
        key = issue_key(conn, tenant)[1]
    url = system.start_api("api-flows")
    auth = {"Authorization": f"Bearer {key}", "x-gateway-inference-fairness-id": "quiet"}
    warm = httpx.post(
        f"{url}/v1/infer", json={"model": "sim", "input": "w"}, headers=auth, timeout=60
    )
    assert warm.status_code == 200, warm.text
    n = 8000
    burst_into_kafka(system, tenant.id, n, fairness_id="burst")
    try:
        quiet_lat, burst_done_at_5 = quiet_requests(
            url, auth, lambda: done_count(system, tenant.id)
        )
    finally:
        system.stop("api-flows")
    # The first quiet request may sit behind the burst inside a Kafka partition (FIFO);
    # from then on the flows' round robin serves it in the tenant's next turn. One flow
    # of the tenant (no header) would have answered it only after the whole burst.
    assert statistics.median(quiet_lat[1:]) < 1.0, (quiet_lat, burst_done_at_5)
    assert 0 <= burst_done_at_5 < n, "the quiet flow waited for the whole burst"
    # Leave no backlog behind for the tests that follow (it would make them shed).
    deadline = time.time() + 120
    while time.time() < deadline and done_count(system, tenant.id) < n + 11:
        time.sleep(0.5)
    assert done_count(system, tenant.id) == n + 11
    time.sleep(3)  # and the API instances' view of the backlog has caught up


def test_admission_sheds_the_tenant_that_owns_the_backlog(system: System) -> None:
    """A paid tenant with 18,000 requests queued (9 s of capacity) is answered 503 with
    Retry-After, while another paid tenant with nothing queued is still admitted and
    served (the round robin serves it in the next batch)."""
    with make_engine(system.settings.database_url).begin() as conn:
        noisy = create_tenant(conn, f"noisy-{uuid.uuid4().hex[:8]}", "paid")
        noisy_key = issue_key(conn, noisy)[1]
    quiet = new_tenant(system, "paid")
    url = system.start_api("api-tenant-shed")
    # 9 s of the test system's capacity, under its scheduler's buffer (20,000): longer
    # than admission's rate window, so it counts as overload though this instance saw
    # none of it arrive.
    n = 18_000
    burst_into_kafka(system, noisy.id, n)
    try:
        deadline = time.time() + 20
        while time.time() < deadline and queued_paid(system) < 14_000:
            time.sleep(0.1)
        time.sleep(0.6)  # the API instance reads the load reports four times a second
        shed = httpx.post(
            f"{url}/v1/infer",
            json={"model": "sim", "input": "more"},
            headers={"Authorization": f"Bearer {noisy_key}"},
            timeout=30,
        )
        assert shed.status_code == 503, "the tenant owning the backlog was not shed"
        assert int(shed.headers["Retry-After"]) >= 1
        assert "overloaded" in shed.json()["error"]["message"]
        served = httpx.post(
            f"{url}/v1/infer",
            json={"model": "sim", "input": "quiet"},
            headers={"Authorization": f"Bearer {quiet}"},
            timeout=30,
        )
        assert served.status_code == 200, served.text
        assert done_count(system, noisy.id) < n, "the burst was still queued"
    finally:
        system.stop("api-tenant-shed")
    deadline = time.time() + 120  # leave no backlog for the tests that follow
    while time.time() < deadline and done_count(system, noisy.id) < n:
        time.sleep(0.5)
    assert done_count(system, noisy.id) == n
    time.sleep(3)


def test_a_backlog_of_a_higher_tier_refuses_free_first_with_retry_after(system: System) -> None:
    """Paid work queued past what free's 5 s SLO leaves: free is refused with 503 and
    Retry-After (it would wait behind all of it), enterprise is still served."""
    noisy = new_tenant_id(system, "paid")
    url = system.start_api("api-tier-order")
    n = 20_000  # 10 s of the test system's capacity
    burst_into_kafka(system, noisy, n)
    try:
        deadline = time.time() + 10
        while time.time() < deadline and queued_paid(system) < 12_000:
            time.sleep(0.1)
        time.sleep(1.0)  # the API instance reads the load reports four times a second
        free = httpx.post(
            f"{url}/v1/infer",
            json={"model": "sim", "input": "x"},
            headers=system.headers("free"),
            timeout=30,
        )
        enterprise = httpx.post(
            f"{url}/v1/infer",
            json={"model": "sim", "input": "x"},
            headers=system.headers("enterprise"),
            timeout=30,
        )
        assert free.status_code == 503 and int(free.headers["Retry-After"]) >= 1, free.text
        assert "overloaded" in free.json()["error"]["message"]
        assert enterprise.status_code == 200, enterprise.text
    finally:
        system.stop("api-tier-order")
    deadline = time.time() + 120  # leave no backlog for the tests that follow
    while time.time() < deadline and done_count(system, noisy) < n:
        time.sleep(0.5)
    assert done_count(system, noisy) == n
    time.sleep(3)


def test_a_model_that_cannot_meet_a_tiers_slo_refuses_at_once_saying_so(system: System) -> None:
    """An API instance whose enterprise SLO (100 ms) is shorter than a batch of ``sim``
    (100 ms) plus the scheduler's margin: every enterprise request is refused at once
    with a message that says why; paid, whose SLO fits, is served."""
    url = system.start_api(
        "api-slo",
        env={"GRISTMILL_TIER_SLO_MS": json.dumps({"enterprise": 100, "paid": 2000, "free": 5000})},
    )
    try:
        time.sleep(1.0)  # the first load reports
        ent = httpx.post(
            f"{url}/v1/infer",
            json={"model": "sim", "input": "x"},
            headers=system.headers("enterprise"),
            timeout=30,
        )
        paid = httpx.post(
            f"{url}/v1/infer",
            json={"model": "sim", "input": "x"},
            headers=system.headers("paid"),
            timeout=30,
        )
        assert ent.status_code == 503, ent.text
        assert "cannot finish within its deadline of 100 ms" in ent.json()["error"]["message"]
        assert paid.status_code == 200, paid.text
    finally:
        system.stop("api-slo")


def _live_sim_capacity(system: System) -> float:
    s = system.settings
    with make_engine(s.database_url).connect() as conn:
        rows = conn.execute(live_reports_stmt(s.load_report_stale_s, s.topic_prefix)).all()
    return sum(float(r.capacity.get("sim@1", {}).get("items_s", 0.0)) for r in rows)


def _wait_for(pred: Callable[[], bool], timeout_s: float, what: Callable[[], object]) -> float:
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if pred():
            return time.time() - t0
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s} s; last seen: {what()}")


def test_capacity_follows_schedulers_joining_and_dying(system: System) -> None:
    """The capacity admission divides by is the live schedulers' measured throughput:
    it doubles when a second scheduler with as many workers joins, and falls back
    within the report staleness window when that one is killed -9."""
    seen = lambda: _live_sim_capacity(system)  # noqa: E731
    # The fixture's scheduler at full strength: all its workers said hello and reported.
    s = system.settings
    per_worker = s.sim_max_batch / (s.sim_batch_ms / 1000)
    # two workers' worth, less a little: measured batches take ~100.4 ms, not 100
    _wait_for(lambda: seen() >= 1.9 * per_worker, 60, seen)
    one = seen()
    system.start_scheduler("sched-extra", workers=2, models="sim")
    try:
        _wait_for(lambda: seen() > 1.5 * one, 90, lambda: (one, seen()))
    finally:
        system.stop("sched-extra", signal.SIGKILL)
    took = _wait_for(lambda: seen() < 1.25 * one, 30, lambda: (one, seen()))
    assert took <= s.load_report_stale_s + 2
    # Let the consumer group drop the dead member (6 s session timeout) before the tests
    # that follow send requests to partitions it held.
    time.sleep(max(0.0, 9 - took))


def test_a_stopped_api_instance_stops_counting_at_once(system: System) -> None:
    """Rate limits are split over the live instances; one shut down cleanly leaves the
    count when it stops, not a stale window later (its peers would run at half rate)."""
    s = system.settings

    def live() -> int:
        with make_engine(s.database_url).connect() as conn:
            stmt = live_instances_stmt(s.load_report_stale_s, s.topic_prefix)
            return int(conn.execute(stmt).scalar_one())

    before = live()
    system.start_api("api-extra")
    deadline = time.time() + 10
    while live() == before and time.time() < deadline:
        time.sleep(0.1)
    assert live() == before + 1
    system.stop("api-extra")
    assert live() == before
