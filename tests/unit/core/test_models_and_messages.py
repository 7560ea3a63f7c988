"""Model specs validate requests; messages round-trip; ids are stable per key."""

from __future__ import annotations

import uuid

import pytest

from core.config import Settings
from core.errors import InvalidInput
from core.ids import uuid7
from core.messages import RequestMessage, body_hash, job_item_request_id, job_item_request_ids
from core.models.catalog import build_specs, latest
from core.models.sim import SimSpec, sim_output
from workers.models.sim import SimModel

SPECS = build_specs(Settings())


def test_sim_spec_rejects_non_strings_and_empty_and_long() -> None:
    spec = SPECS["sim"]["1"]
    with pytest.raises(InvalidInput, match="string"):
        spec.validate_input(5)
    with pytest.raises(InvalidInput, match="empty"):
        spec.validate_input("  ")
    with pytest.raises(InvalidInput, match="at most"):
        spec.validate_input("x" * (spec.max_input_chars + 1))
    spec.validate_input("hello")


def test_params_defaults_unknown_and_types() -> None:
    spec = SPECS["sim"]["1"]
    assert spec.normalize_params(None) == {"salt": ""}
    with pytest.raises(InvalidInput, match="unknown parameter 'temperature'") as exc:
        spec.normalize_params({"temperature": 1})
    assert exc.value.field == "params.temperature"
    with pytest.raises(InvalidInput, match="must be str"):
        spec.normalize_params({"salt": 3})
    assert spec.batch_params({"salt": "x"}) == (("salt", "x"),)


def test_sim_predict_is_per_input_and_ordered() -> None:
    model = SimModel(SimSpec(name="sim", version="1", max_batch_size=10, batch_ms=1))
    out = model.predict(["a", "b", "a"], {"salt": ""})
    assert out == [sim_output("a"), sim_output("b"), sim_output("a")]
    assert out[0] != out[1]
    with pytest.raises(ValueError):
        model.predict(["x"] * 11, {})


def test_latest_version_is_numeric_aware() -> None:
    a = SimSpec(name="sim", version="2", max_batch_size=1)
    b = SimSpec(name="sim", version="10", max_batch_size=1)
    assert latest({"2": a, "10": b}) is b


def test_a_job_made_before_decision_72_keeps_uuid5_item_ids() -> None:
    ns = uuid.UUID("0b5c0f7e-4f3a-4a39-9c53-6f0c3f6e2a11")
    for job in ("j", str(uuid.uuid4())):
        for attempt in (0, 1, 12):
            ids = job_item_request_ids(job, attempt)
            for index in (0, 1, 9, 10, 99_999, 2**31 - 1):
                want = str(uuid.uuid5(ns, f"job\x00{job}\x00{index}\x00{attempt}"))
                assert ids(index) == job_item_request_id(job, index, attempt) == want


def test_job_item_request_id_is_stable_per_job_index_and_attempt() -> None:
    assert job_item_request_id("j", 3) == job_item_request_id("j", 3, 0)
    assert job_item_request_id("j", 3) != job_item_request_id("j", 4)
    assert job_item_request_id("j", 3, 1) != job_item_request_id("j", 3, 0)
    assert job_item_request_id("j", 3) != job_item_request_id("k", 3)


def test_a_time_ordered_job_names_its_items_in_index_order_under_its_time() -> None:
    job = uuid7(1_796_000_000_000)
    for attempt in (0, 1):
        ids = [job_item_request_id(job, i, attempt) for i in (0, 1, 2, 999, 999_999, 2**20)]
        assert ids == sorted(ids)
        assert all(uuid.UUID(i).version == 7 and i[:13] == job[:13] for i in ids)
    assert job_item_request_id(job, 5, 1) != job_item_request_id(job, 5, 0)
    assert job_item_request_id(job, 5) == job_item_request_ids(job)(5)


def test_body_hash_ignores_key_order() -> None:
    assert body_hash("m", "x", {"a": 1, "b": 2}) == body_hash("m", "x", {"b": 2, "a": 1})
    assert body_hash("m", "x", {}) != body_hash("m", "y", {})


def test_message_round_trip() -> None:
    m = RequestMessage(
        request_id="r",
        tenant_id="t",
        priority="free",
        model="sim",
        version="1",
        input="hi",
        params={"salt": ""},
        deadline=2.0,
        received_at=1.0,
    )
    assert RequestMessage.decode(m.encode()) == m
