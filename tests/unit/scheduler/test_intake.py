"""A fetched message becomes a queued request or a reject (scheduler/intake.py)."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import pytest

from core.config import Settings
from core.messages import RequestMessage
from core.models.catalog import build_specs
from core.vocab import PRIORITY_CLASSES
from scheduler.batcher import BatchKey, Pending
from scheduler.dispatch import Reject
from scheduler.intake import decode

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
