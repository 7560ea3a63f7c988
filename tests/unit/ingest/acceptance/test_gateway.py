"""ingest/acceptance/gateway.py: the Gateway API Inference Extension's objective header
as a tier hint that only ever lowers a request (decision 56), pure and through every
front door on the in-memory stand-ins."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import TestClient

from core.config import Settings
from core.errors import InvalidInput
from core.vocab import TIERS, Tier
from ingest.acceptance.gateway import (
    FAIRNESS_ID_MAX_CHARS,
    fairness_id,
    objective_tier,
    scheduled_tier,
)
from tests.unit.ingest.acceptance.test_front_doors import DOORS
from tests.unit.ingest.stubs import stub_app

OBJECTIVES = {"critical": Tier.ENTERPRISE, "standard": Tier.PAID, "sheddable": Tier.FREE}


def test_an_objective_asks_for_its_configured_tier_or_a_tiers_own_name() -> None:
    assert objective_tier(OBJECTIVES, "sheddable") == Tier.FREE
    assert objective_tier(OBJECTIVES, " critical ") == Tier.ENTERPRISE
    assert objective_tier({}, "paid") == Tier.PAID
    assert objective_tier(OBJECTIVES, "unknown-objective") is None
    assert objective_tier(OBJECTIVES, None) is None
    assert objective_tier(OBJECTIVES, "") is None


@given(st.sampled_from(TIERS), st.one_of(st.none(), st.sampled_from(TIERS)))
def test_a_hint_never_raises_a_request_above_the_tier_its_door_chose(
    chosen: Tier, asked: Tier | None
) -> None:
    got = scheduled_tier(str(chosen), asked)
    assert TIERS.index(Tier(got)) <= TIERS.index(chosen)
    if asked is not None:
        assert got == str(min(chosen, asked, key=TIERS.index))


@given(st.text(max_size=300))
def test_any_header_value_is_read_without_raising(value: str) -> None:
    assert objective_tier(OBJECTIVES, value) in (None, *TIERS)


def _sent_priorities(tier: str, path: str, body: dict[str, Any], header: str | None) -> set[str]:
    settings = Settings(gateway_objective_tiers=OBJECTIVES)
    app, stubs = stub_app(settings, tier=tier)
    with TestClient(app) as client:
        headers = {"Authorization": f"Bearer {stubs.key}"}
        if header is not None:
            headers["x-gateway-inference-objective"] = header
        r = client.post(path, json=body, headers=headers)
        assert r.status_code == 200, r.text
    return {str(m.priority) for _, m in stubs.producer.sent}


@pytest.mark.parametrize(("path", "body", "_inputs"), DOORS, ids=[d[0] for d in DOORS])
def test_every_door_lowers_a_request_to_its_objective_and_never_raises_it(
    path: str, body: dict[str, Any], _inputs: list[str]
) -> None:
    assert _sent_priorities("paid", path, body, "sheddable") == {"free"}
    assert _sent_priorities("paid", path, body, "critical") == {"paid"}  # not above the key
    assert _sent_priorities("free", path, body, "enterprise") == {"free"}
    assert _sent_priorities("enterprise", path, body, "standard") == {"paid"}
    assert _sent_priorities("paid", path, body, "no-such-objective") == {"paid"}
    assert _sent_priorities("paid", path, body, None) == {"paid"}


# ---- x-gateway-inference-fairness-id: the flow inside the tenant (decision 58) ----------


def test_a_fairness_id_is_read_as_sent_and_absent_or_empty_is_the_default_flow() -> None:
    assert fairness_id("user-42") == "user-42"
    assert fairness_id("team a/session:9") == "team a/session:9"
    assert fairness_id("x" * FAIRNESS_ID_MAX_CHARS) == "x" * FAIRNESS_ID_MAX_CHARS
    assert fairness_id(None) is None
    assert fairness_id("") is None


@pytest.mark.parametrize(
    "bad", ["x" * (FAIRNESS_ID_MAX_CHARS + 1), "nul\x00inside", "tab\there", "caf\xe9", "\x7f"]
)
def test_a_bad_fairness_id_is_a_400_naming_the_header(bad: str) -> None:
    with pytest.raises(InvalidInput, match="x-gateway-inference-fairness-id") as e:
        fairness_id(bad)
    assert e.value.status == 400


@given(st.text(max_size=300))
def test_any_fairness_id_is_accepted_as_itself_or_refused_with_a_400(value: str) -> None:
    try:
        got = fairness_id(value)
    except InvalidInput:
        return
    assert got == (value or None)


def _sent_flows(path: str, body: dict[str, Any], header: str | None) -> tuple[int, set[Any]]:
    app, stubs = stub_app(Settings(), tier="paid")
    with TestClient(app) as client:
        headers = {"Authorization": f"Bearer {stubs.key}"}
        if header is not None:
            headers["x-gateway-inference-fairness-id"] = header
        r = client.post(path, json=body, headers=headers)
        if r.status_code != 200:
            assert "x-gateway-inference-fairness-id" in r.text, r.text
    return r.status_code, {m.fairness_id for _, m in stubs.producer.sent}


@pytest.mark.parametrize(("path", "body", "_inputs"), DOORS, ids=[d[0] for d in DOORS])
def test_every_door_carries_the_fairness_id_in_its_messages_and_refuses_a_bad_one(
    path: str, body: dict[str, Any], _inputs: list[str]
) -> None:
    assert _sent_flows(path, body, "user-1") == (200, {"user-1"})
    assert _sent_flows(path, body, None) == (200, {None})
    assert _sent_flows(path, body, "y" * 300) == (400, set())  # nothing produced
