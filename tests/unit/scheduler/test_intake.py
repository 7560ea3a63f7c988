"""A fetched message becomes a queued request or a reject (scheduler/core/intake.py)."""

from __future__ import annotations

import uuid
from dataclasses import fields
from typing import Any

import orjson
import pytest

from core.config import Settings
from core.messages import RequestMessage
from core.models.catalog import build_specs
from core.vocab import PRIORITY_CLASSES
from scheduler.core import intake
from scheduler.core.batcher import BatchKey, Pending
from scheduler.core.intake import Malformed, _message, _strict_message, decode
from scheduler.core.plans import Reject

SPECS = build_specs(Settings())
TP = ("gm.requests.paid", 2)
TENANT = str(uuid.uuid4())


def message(**over: Any) -> dict[str, Any]:
    m = RequestMessage(
        request_id=str(uuid.uuid4()),
        tenant_id=TENANT,
        priority="paid",
        model="sim",
        version="1",
        input="hello",
        params={"salt": "s"},
        deadline=1_700_000_100.0,
        received_at=1_700_000_000.0,
    )
    data: dict[str, Any] = orjson.loads(m.encode())
    data.update(over)
    return data


def run(value: bytes | None) -> Pending | Reject:
    return decode(value, tp=TP, offset=7, produced_at=1_700_000_000.5, now=1.7e9 + 1, specs=SPECS)


def test_a_good_message_is_queued_under_its_batch_key() -> None:
    got = run(orjson.dumps(message()))
    assert isinstance(got, Pending)
    assert got.key == BatchKey("sim", "1", (("salt", "s"),))
    assert got.rank == PRIORITY_CLASSES.index("paid") and got.tp == TP and got.offset == 7
    assert got.msg.extra["produced_at"] == 1_700_000_000.5


def test_fields_this_version_does_not_know_are_ignored() -> None:
    got = run(orjson.dumps(message(trace_context="00-abc", future={"x": 1})))
    assert isinstance(got, Pending)


def test_content_only_postgresql_refuses_is_queued_the_persister_isolates_it() -> None:
    got = run(orjson.dumps(message(input="a\x00b", params={"salt": "x\x00y"})))
    assert isinstance(got, Pending) and got.msg.input == "a\x00b"


@pytest.mark.parametrize("raw", [b"\xff\x00not json", b"", b"[1, 2]", b'"text"', None])
def test_what_is_not_a_json_object_is_rejected_without_a_row(raw: bytes | None) -> None:
    got = run(raw)
    assert isinstance(got, Reject) and got.row is None
    assert got.tp == TP and got.offset == 7 and got.value == (raw or b"")
    assert got.priority == PRIORITY_CLASSES.index("paid")  # its topic's class


@pytest.mark.parametrize(
    "over,why",
    [
        ({"params": ["salt"]}, "params"),
        ({"deadline": "soon"}, "deadline"),
        ({"deadline": True}, "deadline"),
        ({"received_at": 1e300}, "received_at"),
        ({"attempt": -1}, "attempt"),
        ({"item_index": 2**40}, "item_index"),
        ({"weight": 0}, "weight"),
        ({"job_id": "not-a-uuid"}, "job_id"),
        ({"params": {"salt": ["a", "list"]}}, "unhashable"),  # a batching param keys a queue
        ({"params": {}}, "salt"),  # a batching param the spec needs
    ],
)
def test_missing_or_mistyped_fields_are_rejected_with_a_failed_row(
    over: dict[str, Any], why: str
) -> None:
    data = message(**over)
    got = run(orjson.dumps(data))
    assert isinstance(got, Reject) and why in got.reason, got
    assert got.row is not None
    assert got.row["request_id"] == data["request_id"] and got.row["tenant_id"] == TENANT
    assert got.row["status"] == "failed" and why in (got.row["error"] or "")
    assert got.row["kafka_offset"] == 7 and got.row["model"] == "sim"


def test_a_missing_field_is_named() -> None:
    data = message()
    del data["input"]
    got = run(orjson.dumps(data))
    assert isinstance(got, Reject) and got.reason == "missing field input"


def test_no_row_without_a_valid_request_and_tenant() -> None:
    for over in ({"request_id": "r1"}, {"tenant_id": 5}):
        got = run(orjson.dumps(message(**over)))
        assert isinstance(got, Reject) and got.row is None


def test_a_rejected_job_item_counts_toward_its_job() -> None:
    job = str(uuid.uuid4())
    got = run(orjson.dumps(message(job_id=job, item_index=3, priority="jobs", deadline="x")))
    assert isinstance(got, Reject) and got.row is not None
    assert got.row["job_id"] == job and got.row["item_index"] == 3
    assert got.row["priority"] == "jobs"


def test_an_unknown_class_queues_as_free_traffic() -> None:
    got = run(orjson.dumps(message(priority="platinum")))
    assert isinstance(got, Pending) and got.rank == PRIORITY_CLASSES.index("free")


# ---- the fast path for the API's own message, held to the strict one ---------------


def _strict_or_reason(data: dict[str, Any]) -> RequestMessage | str:
    try:
        return _strict_message(data)
    except Malformed as exc:
        return f"Malformed: {exc}"
    except TypeError as exc:
        return f"TypeError: {exc}"


def _fast_or_reason(data: dict[str, Any]) -> RequestMessage | str:
    try:
        return _message(data)
    except Malformed as exc:
        return f"Malformed: {exc}"
    except TypeError as exc:
        return f"TypeError: {exc}"


def _without(name: str) -> dict[str, Any]:
    data = message()
    del data[name]
    return data


JOB = str(uuid.uuid4())
# Messages the fast path takes, and ones it must leave to the strict path.
VARIANTS: list[dict[str, Any]] = [
    message(),
    message(job_id=JOB, item_index=0, priority="jobs", job_attempt=2, attempt=1),
    message(deadline=1_700_000_100, received_at=1_700_000_000, weight=3),
    message(weight=0.25, body_hash="ab" * 32, extra={"k": "v"}),
    message(future_field=[1, 2], trace_context="00-abc"),
    message(tenant_id=TENANT.upper()),
    message(request_id="{" + str(uuid.uuid4()) + "}"),
    message(job_id=JOB.replace("-", "")),
    message(item_index=2**31 - 1, attempt=2**31 - 1),
    message(input={"text": "x", "ids": [1, 2]}),
    _without("body_hash"),
    _without("extra"),
    _without("weight"),
    _without("attempt"),
    _without("job_id"),
    _without("input"),
    _without("request_id"),
    _without("params"),
    message(request_id=5),
    message(request_id="r1"),
    message(tenant_id="t1"),
    message(tenant_id=["x"]),
    message(priority=None),
    message(model=1),
    message(version=1.0),
    message(params=None),
    message(params=[]),
    message(deadline=0),
    message(deadline=-1.0),
    message(deadline=1e11),
    message(deadline=False),
    message(received_at="now"),
    message(body_hash=3),
    message(job_id=7),
    message(job_id="nope"),
    message(item_index=-1),
    message(item_index=1.0),
    message(item_index=True),
    message(attempt=2**31),
    message(attempt=False),
    message(job_attempt=-5),
    message(weight=0),
    message(weight=-1.5),
    message(weight=True),
    message(weight="1"),
    message(weight=1e308 * 10),  # inf: orjson writes null
    message(extra=[]),
    message(extra="x"),
    message(body_hash=None, job_id=None, item_index=None),
    message(fairness_id="user-7"),
    message(fairness_id=None),
    message(fairness_id=7),
    message(fairness_id=["u"]),
]


@pytest.mark.parametrize("data", VARIANTS)
def test_the_fast_path_accepts_and_rejects_exactly_what_the_strict_path_does(
    data: dict[str, Any],
) -> None:
    # Through JSON, as the scheduler reads it.
    data = orjson.loads(orjson.dumps(data))
    assert _fast_or_reason(data) == _strict_or_reason(orjson.loads(orjson.dumps(data)))


@pytest.mark.parametrize("field", ["body_hash", "attempt", "job_attempt", "weight", "extra"])
def test_null_in_a_field_that_has_a_default_is_rejected_and_named(field: str) -> None:
    got = run(orjson.dumps(message(**{field: None})))
    assert isinstance(got, Reject) and got.reason == f"field {field} has type NoneType"
    assert got.row is not None and got.row["status"] == "failed"


@pytest.mark.parametrize("field", ["job_id", "item_index", "fairness_id"])
def test_null_in_a_field_that_may_be_absent_means_absent(field: str) -> None:
    got = run(orjson.dumps(message(**{field: None})))
    assert isinstance(got, Pending) and getattr(got.msg, field) is None


# ---- what decode keeps once --------------------------------------------------------


def test_messages_with_equal_batching_params_share_one_batch_key() -> None:
    a, b = run(orjson.dumps(message())), run(orjson.dumps(message()))
    c = run(orjson.dumps(message(params={"salt": "t"})))
    assert isinstance(a, Pending) and isinstance(b, Pending) and isinstance(c, Pending)
    assert a.key is b.key and a.key == BatchKey("sim", "1", (("salt", "s"),))
    assert c.key == BatchKey("sim", "1", (("salt", "t"),)) and c.key != a.key


def test_equal_but_differently_typed_params_key_as_they_always_did() -> None:
    # 1 == 1.0: such keys were equal, so one queue, before the cache too.
    one = run(orjson.dumps(message(params={"salt": 1})))
    other = run(orjson.dumps(message(params={"salt": 1.0})))
    text = run(orjson.dumps(message(params={"salt": "1"})))
    assert isinstance(one, Pending) and isinstance(other, Pending) and isinstance(text, Pending)
    assert one.key == other.key and text.key != one.key


@pytest.mark.parametrize("salt", [["a"], {"a": 1}, [["nested"]]])
def test_an_unhashable_batching_param_is_rejected_even_once_its_key_is_cached(salt: Any) -> None:
    assert isinstance(run(orjson.dumps(message())), Pending)
    got = run(orjson.dumps(message(params={"salt": salt})))
    assert isinstance(got, Reject) and got.reason.startswith("TypeError: unhashable type")
    assert got.row is not None


def test_unhashable_params_that_do_not_batch_are_queued() -> None:
    lm = SPECS["gristmill-lm"]["1"]
    params = {"max_tokens": 4, "temperature": 0.5, "seed": None, "stop": ["\n", "."]}
    got = run(orjson.dumps(message(model=lm.name, version=lm.version, params=params)))
    assert isinstance(got, Pending) and got.key == BatchKey(lm.name, lm.version, ())
    assert got.msg.params == params


def test_an_unknown_model_keys_by_all_its_params() -> None:
    got = run(orjson.dumps(message(model="gone", params={"b": 2, "a": 1})))
    assert isinstance(got, Pending) and got.key == BatchKey("gone", "1", (("a", 1), ("b", 2)))
    got = run(orjson.dumps(message(model="gone", params={"a": [1]})))
    assert isinstance(got, Reject) and "unhashable" in got.reason


def test_the_key_cache_is_bounded_and_still_right_once_emptied() -> None:
    for i in range(intake.KEY_CACHE_SIZE + 10):
        got = run(orjson.dumps(message(params={"salt": f"s{i}"})))
        assert isinstance(got, Pending) and got.key.params == (("salt", f"s{i}"),)
        assert len(intake._KEYS) <= intake.KEY_CACHE_SIZE


def test_requests_of_one_tenant_share_its_id_and_odd_ids_are_not_remembered() -> None:
    a, b = run(orjson.dumps(message())), run(orjson.dumps(message()))
    assert isinstance(a, Pending) and isinstance(b, Pending)
    assert a.msg.tenant_id is b.msg.tenant_id and a.msg.tenant_id == TENANT
    odd = TENANT.upper()
    got = run(orjson.dumps(message(tenant_id=odd)))
    assert isinstance(got, Pending) and got.msg.tenant_id == odd
    assert odd not in intake._TENANTS


def test_the_fast_path_builds_the_request_field_for_field() -> None:
    data = message(
        job_id=JOB, item_index=3, weight=2.5, body_hash="h", extra={"x": 1}, fairness_id="u"
    )
    fast = _message(orjson.loads(orjson.dumps(data)))
    assert fast == RequestMessage(**data)
    assert [f.name for f in fields(RequestMessage)] == [
        "request_id", "tenant_id", "priority", "model", "version", "input", "params",
        "deadline", "received_at", "body_hash", "job_id", "item_index", "attempt",
        "job_attempt", "weight", "extra", "fairness_id",
    ]  # fmt: skip


def test_a_message_from_before_the_fairness_id_is_the_tenants_default_flow() -> None:
    data = message()
    del data["fairness_id"]
    got = run(orjson.dumps(data))
    assert isinstance(got, Pending) and got.msg.fairness_id is None and got.flow is None


def test_the_fairness_id_is_the_requests_flow_and_a_mistyped_one_is_named() -> None:
    got = run(orjson.dumps(message(fairness_id="user-7")))
    assert isinstance(got, Pending) and got.flow == "user-7"
    bad = run(orjson.dumps(message(fairness_id=7)))
    assert isinstance(bad, Reject) and bad.reason == "field fairness_id has type int"
