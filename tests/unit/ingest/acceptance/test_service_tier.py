"""``service_tier`` (ingest/acceptance/service_tier.py, decision 66): the mapping and the
policy pure, then through every front door on in-memory stand-ins: flex is queued at job
items' priority, accepted while sync work is refused for capacity, answered 200 when
done within its caller's patience and 202 with Location after, and echoed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from core.config import Settings
from core.errors import InvalidInput
from core.messages import SERVICE_TIER, service_tier
from core.vocab import PriorityClass, ServiceTier, Tier
from ingest.acceptance.deferred import COMPLETION_HEADER
from ingest.acceptance.prefer import Prefer
from ingest.acceptance.service_tier import (
    Service,
    asked_tier,
    flex_timeout_ms,
    may_be_flex,
    parse_service_tier,
    patience_s,
    plan_service,
)
from ingest.admission import policy
from ingest.admission.capacity import Decision
from ingest.admission.kv import KVDecision
from tests.unit.ingest.stubs import Stubs, stub_app

FLEX, DEFAULT, PRIORITY = ServiceTier.FLEX, ServiceTier.DEFAULT, ServiceTier.PRIORITY


# ---- the mapping, pure -----------------------------------------------------------------
def test_a_service_tier_is_one_of_three_exact_names_or_a_400_naming_the_field() -> None:
    assert parse_service_tier(None) is None
    assert [parse_service_tier(v) for v in ("flex", "default", "priority")] == [
        FLEX,
        DEFAULT,
        PRIORITY,
    ]
    for bad in ("Flex", "auto", "", 1, ["flex"]):
        with pytest.raises(InvalidInput) as e:
            parse_service_tier(bad)
        assert e.value.field == "service_tier" and "'flex'" in e.value.message


def test_the_body_and_the_header_may_both_name_it_but_must_agree() -> None:
    assert asked_tier(None, None) is None
    assert asked_tier(None, " flex ") is FLEX
    assert asked_tier("flex", "flex") is FLEX
    assert asked_tier("priority", None) is PRIORITY
    with pytest.raises(InvalidInput) as e:
        asked_tier("flex", "default")
    assert "disagree" in e.value.message
    with pytest.raises(InvalidInput) as e:
        asked_tier(None, "slow")
    assert e.value.field == "X-Service-Tier"


@pytest.mark.parametrize("key", ["free", "paid", "enterprise"])
def test_flex_is_queued_with_job_items_whatever_the_key_door_or_gateway(key: str) -> None:
    s = plan_service(FLEX, key, "free", Tier.FREE)
    assert s == Service(FLEX, key, PriorityClass.JOBS) and s.flex


def test_default_is_the_keys_tier_as_the_door_and_a_gateway_lower_it() -> None:
    assert plan_service(None, "paid", None, None) == Service(DEFAULT, "paid", PriorityClass.PAID)
    assert plan_service(DEFAULT, "enterprise", "free", None).priority is PriorityClass.FREE
    assert plan_service(DEFAULT, "paid", None, Tier.FREE).tier == "free"
    assert plan_service(DEFAULT, "paid", None, Tier.ENTERPRISE).tier == "paid"  # never raised


def test_priority_is_the_highest_tier_the_key_may_use_and_says_so_only_at_the_top() -> None:
    top = plan_service(PRIORITY, "enterprise", "free", None)  # Triton's lowering undone
    assert top == Service(PRIORITY, "enterprise", PriorityClass.ENTERPRISE)
    # A paid key has nothing above paid: served, and told, default.
    assert plan_service(PRIORITY, "paid", "free", None) == Service(
        DEFAULT, "paid", PriorityClass.PAID
    )
    # The operator's gateway hint still lowers it.
    assert plan_service(PRIORITY, "enterprise", None, Tier.PAID).served is DEFAULT


def test_flex_deadline_and_patience() -> None:
    assert flex_timeout_ms(None, 3_600_000) == 3_600_000
    assert flex_timeout_ms(120_000, 3_600_000) == 120_000
    flex, sync = plan_service(FLEX, "paid", None, None), plan_service(None, "paid", None, None)
    none, wait7 = Prefer(), Prefer(wait_s=7)
    assert patience_s(sync, None, wait7, 55, may_hold=False) is None  # until its deadline
    assert patience_s(sync, 3, none, 55, may_hold=True) == 3
    assert patience_s(flex, None, none, 55, may_hold=True) == 55
    assert patience_s(flex, None, wait7, 55, may_hold=True) == 7
    assert patience_s(flex, None, Prefer(respond_async=True), 55, may_hold=True) == 0
    assert patience_s(flex, 2, wait7, 55, may_hold=True) == 2  # what its door set
    assert patience_s(flex, None, wait7, 55, may_hold=False) == 0  # no slot: 202 at once


def test_a_refused_sync_slot_parses_only_what_may_ask_for_flex() -> None:
    assert may_be_flex(b'{"service_tier": "flex"}', None)
    assert may_be_flex(b"{}", " flex")
    assert not may_be_flex(b'{"model": "sim", "input": "x"}', None)
    assert not may_be_flex(b"{}", "default")


def test_a_message_names_its_tier_for_the_request_log_or_nothing() -> None:
    assert service_tier({SERVICE_TIER: "flex"}) == "flex"
    assert service_tier({}) is None
    assert service_tier({SERVICE_TIER: "turbo"}) is None
    assert service_tier({SERVICE_TIER: 1}) is None


def test_flex_deadline_may_not_be_shorter_than_a_sync_slo() -> None:
    with pytest.raises(ValueError, match="flex_timeout_ms"):
        Settings(flex_timeout_ms=1_500)


# ---- every front door ------------------------------------------------------------------
EMBED = "all-minilm-l6-v2"
KSERVE = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}]}
DOORS: list[tuple[str, dict[str, Any], int]] = [
    ("/v1/infer", {"model": "sim", "input": "hello"}, 1),
    ("/v1/embeddings", {"model": EMBED, "input": ["a", "b"]}, 2),
    ("/v2/models/sim/infer", KSERVE, 2),
    ("/v1/completions", {"model": "gristmill-lm", "prompt": "hi", "max_tokens": 4}, 1),
]
IDS = [d[0] for d in DOORS]


def asking(path: str, body: dict[str, Any], tier: str) -> dict[str, Any]:
    """The request's keyword arguments asking for ``tier``: KServe in the header."""
    if path.startswith("/v2"):
        return {"json": body, "headers": {"X-Service-Tier": tier}}
    return {"json": {**body, "service_tier": tier}}


@pytest.fixture
def make_api() -> Iterator[Any]:
    clients: list[TestClient] = []

    def make(settings: Settings | None = None, tier: str = "paid") -> tuple[TestClient, Stubs]:
        app, stubs = stub_app(settings, tier)
        client = TestClient(app).__enter__()
        client.headers["Authorization"] = f"Bearer {stubs.key}"
        clients.append(client)
        return client, stubs

    yield make
    for c in clients:
        c.__exit__(None, None, None)


def refuse_capacity(stubs: Stubs) -> None:
    """Admission, as if the queue ahead were too long for any sync deadline."""
    assert stubs.state is not None
    no = Decision(False, retry_after_s=2.0, reason="capacity", message="queue too long (stub)")
    stubs.state.load.admission.decide = lambda *a, **k: no  # type: ignore[method-assign]


@pytest.mark.parametrize(("path", "body", "n"), DOORS, ids=IDS)
def test_flex_is_queued_behind_sync_work_with_its_own_deadline_and_echoed(
    make_api: Any, path: str, body: dict[str, Any], n: int
) -> None:
    client, stubs = make_api()
    r = client.post(path, **asking(path, body, "flex"))
    assert r.status_code == 200, r.text
    assert r.headers["X-Service-Tier"] == "flex"
    if not path.startswith("/v2"):
        assert r.json()["service_tier"] == "flex"
    assert len(stubs.producer.sent) == n
    for topic, m in stubs.producer.sent:
        assert topic.endswith("requests.jobs") and m.priority == PriorityClass.JOBS
        assert m.job_id is None and m.extra[SERVICE_TIER] == "flex"
        # Its deadline is flex's (minutes), not the paid tier's 2 s SLO.
        assert m.deadline - m.received_at == pytest.approx(stubs.settings.flex_timeout_ms / 1000)


@pytest.mark.parametrize(("path", "body", "n"), DOORS, ids=IDS)
def test_without_a_tier_a_request_is_served_and_logged_as_default(
    make_api: Any, path: str, body: dict[str, Any], n: int
) -> None:
    client, stubs = make_api()
    r = client.post(path, json=body)
    assert r.status_code == 200 and r.headers["X-Service-Tier"] == "default"
    assert all(m.extra[SERVICE_TIER] == "default" for _, m in stubs.producer.sent)
    assert all(m.priority == PriorityClass.PAID for _, m in stubs.producer.sent)


@pytest.mark.parametrize(("path", "body", "n"), DOORS[:3], ids=IDS[:3])
def test_flex_is_accepted_while_sync_tiers_are_refused_for_capacity(
    make_api: Any, path: str, body: dict[str, Any], n: int
) -> None:
    client, stubs = make_api()
    refuse_capacity(stubs)
    sync = client.post(path, json=body)
    assert sync.status_code == 503, sync.text
    assert stubs.producer.sent == []
    flex = client.post(path, **asking(path, body, "flex"))
    assert flex.status_code == 200, flex.text
    assert len(stubs.producer.sent) == n


@pytest.mark.parametrize(("path", "body", "n"), DOORS[:3], ids=IDS[:3])
def test_flex_is_accepted_while_the_instance_has_no_sync_slot_left(
    make_api: Any, path: str, body: dict[str, Any], n: int
) -> None:
    client, stubs = make_api()
    inflight = stubs.state.inflight
    inflight.inflight = inflight.max_inflight  # every sync slot held
    assert client.post(path, json=body).status_code == 503
    flex = client.post(path, **asking(path, body, "flex"))
    assert flex.status_code == 200, flex.text
    assert inflight.inflight == inflight.max_inflight  # it took no sync slot
    assert stubs.state.flex_waits.inflight == 0  # and gave its own back


def test_a_completions_flex_request_waits_for_the_kv_cache_instead_of_a_503(
    make_api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, stubs = make_api()
    body = {"model": "gristmill-lm", "prompt": "hi", "max_tokens": 4}
    full = KVDecision(admit=False, retry_after_s=3.0, message="no blocks free (stub)")
    monkeypatch.setattr(policy, "decide_kv", lambda *a, **k: full)
    assert client.post("/v1/completions", json=body).status_code == 503
    assert stubs.producer.sent == []
    r = client.post("/v1/completions", json={**body, "service_tier": "flex"})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == "Hello, world"


@pytest.mark.parametrize(("path", "body", "n"), DOORS, ids=IDS)
def test_flex_not_done_within_its_patience_is_202_with_location_and_stays_queued(
    make_api: Any, path: str, body: dict[str, Any], n: int
) -> None:
    client, stubs = make_api(Settings(allow_weak_durability=True, flex_wait_ms=50))
    stubs.worker.hold = True
    asked: list[tuple[str, str, int]] = []

    async def quote(tenant: Any, spec: Any, items: int) -> int:
        asked.append((tenant.id, spec.name, items))
        return 1_900_000_000

    stubs.state.quote_flex = quote
    r = client.post(path, **asking(path, body, "flex"))
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "in_progress" and r.json()["service_tier"] == "flex"
    assert r.headers["X-Service-Tier"] == "flex"
    rid = stubs.producer.sent[0][1].request_id
    assert r.headers["Location"].endswith(rid)
    assert len(stubs.producer.sent) == n  # accepted: every input is in Kafka
    # Its completion quote (decision 69): as a job of its unanswered inputs, in the
    # header a job's 202 carries and in the body.
    assert [a[2] for a in asked] == [n] and asked[0][1] == stubs.producer.sent[0][1].model
    assert r.headers[COMPLETION_HEADER] == "1900000000"
    assert r.json()["estimated_completion_at"] == 1_900_000_000


def test_a_flex_202_without_a_quote_says_so_and_has_no_header(make_api: Any) -> None:
    """No worker serves the model (no quote), or the backlog read failed: still a 202."""
    client, stubs = make_api(Settings(allow_weak_durability=True, flex_wait_ms=50))
    stubs.worker.hold = True

    async def none(tenant: Any, spec: Any, items: int) -> None:
        return None

    stubs.state.quote_flex = none
    r = client.post("/v1/infer", json={"model": "sim", "input": "x", "service_tier": "flex"})
    assert r.status_code == 202, r.text
    assert COMPLETION_HEADER not in r.headers and r.json()["estimated_completion_at"] is None


def test_flex_honours_prefer_wait_and_respond_async(make_api: Any) -> None:
    client, stubs = make_api()
    stubs.worker.hold = True
    body = {"model": EMBED, "input": "a", "service_tier": "flex"}
    r = client.post("/v1/embeddings", json=body, headers={"Prefer": "wait=0"})
    assert r.status_code == 202 and "Preference-Applied" not in r.headers
    r = client.post("/v1/embeddings", json=body, headers={"Prefer": "respond-async"})
    assert r.status_code == 202 and r.headers["Preference-Applied"] == "respond-async"


def test_an_instance_holding_all_the_flex_calls_it_may_answers_202_at_once(
    make_api: Any,
) -> None:
    client, stubs = make_api(Settings(allow_weak_durability=True, max_flex_waits=0))
    r = client.post("/v1/infer", json={"model": "sim", "input": "x", "service_tier": "flex"})
    assert r.status_code == 202, r.text
    assert r.json()["request_id"] == stubs.producer.sent[0][1].request_id


@pytest.mark.parametrize(("path", "body", "n"), DOORS, ids=IDS)
def test_flex_on_every_door_takes_prefer_wait_as_its_patience(
    make_api: Any, path: str, body: dict[str, Any], n: int
) -> None:
    client, stubs = make_api()
    stubs.worker.hold = True
    t0 = time.monotonic()
    kw = asking(path, body, "flex")
    r = client.post(path, json=kw["json"], headers={**kw.get("headers", {}), "Prefer": "wait=0"})
    assert r.status_code == 202, r.text
    assert time.monotonic() - t0 < stubs.settings.flex_wait_ms / 1000


@pytest.mark.parametrize(("path", "body", "n"), DOORS, ids=IDS)
def test_a_bad_tier_is_a_400_naming_it_before_anything_is_produced(
    make_api: Any, path: str, body: dict[str, Any], n: int
) -> None:
    client, stubs = make_api()
    r = client.post(path, **asking(path, body, "turbo"))
    assert r.status_code == 400, r.text
    assert "service_tier" in r.text or "X-Service-Tier" in r.text
    assert stubs.producer.sent == []


def test_priority_on_an_enterprise_key_undoes_tritons_lowering(make_api: Any) -> None:
    client, stubs = make_api(tier="enterprise")
    low = {**KSERVE, "parameters": {"priority": 3}}
    r = client.post("/v2/models/sim/infer", json=low, headers={"X-Service-Tier": "priority"})
    assert r.status_code == 200 and r.headers["X-Service-Tier"] == "priority"
    assert {m.priority for _, m in stubs.producer.sent} == {PriorityClass.ENTERPRISE}


def test_priority_on_a_paid_key_is_served_as_its_default(make_api: Any) -> None:
    client, stubs = make_api()
    r = client.post("/v1/infer", json={"model": "sim", "input": "x", "service_tier": "priority"})
    assert r.status_code == 200 and r.json()["service_tier"] == "default"
    assert stubs.producer.sent[0][1].priority == PriorityClass.PAID
