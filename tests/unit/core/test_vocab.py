"""core/vocab.py: enums that travel as the strings they always were."""

from __future__ import annotations

import orjson

from core.messages import RequestMessage
from core.vocab import (
    PRIORITY_CLASSES,
    TIER_TO_CLASS,
    TIERS,
    JobStatus,
    ModelRef,
    PriorityClass,
    RequestStatus,
)


def test_enums_equal_their_wire_strings() -> None:
    assert RequestStatus.SUCCEEDED == "succeeded"
    assert f"{PriorityClass.JOBS}" == "jobs"
    assert orjson.dumps({"s": RequestStatus.EXPIRED}) == b'{"s":"expired"}'
    assert [str(t) for t in TIERS] == ["free", "paid", "enterprise"]


def test_priority_ranks_put_the_most_urgent_first() -> None:
    assert [c.rank for c in PRIORITY_CLASSES] == [0, 1, 2, 3]
    assert PRIORITY_CLASSES.index("jobs") == PriorityClass.JOBS.rank == 3  # type: ignore[arg-type]
    assert TIER_TO_CLASS["paid"] is PriorityClass.PAID


def test_finished_job_statuses() -> None:
    assert {s for s in JobStatus if s.finished} == {"completed", "failed", "cancelled", "expired"}


def test_model_ref_is_the_pair_it_names() -> None:
    ref = ModelRef("sim", "1")
    assert ref == ("sim", "1") and hash(ref) == hash(("sim", "1"))
    assert {("sim", "1"): 5}[ref] == 5 and ref.label() == "sim@1"


def test_a_message_keeps_a_plain_string_priority() -> None:
    msg = RequestMessage(
        request_id="r",
        tenant_id="t",
        priority=PriorityClass.PAID,
        model="sim",
        version="1",
        input="x",
        params={},
        deadline=1.0,
        received_at=0.0,
    )
    back = RequestMessage.decode(msg.encode())
    assert back.priority == "paid" and type(back.priority) is str
