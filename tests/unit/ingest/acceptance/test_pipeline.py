"""ingest/acceptance/pipeline.py's pure parts and the rate a many-input request pays
(ingest/admission/policy.py)."""

from __future__ import annotations

import math
import uuid
from typing import cast

import pytest

from core.config import Settings
from core.errors import DeadlineExceeded, InvalidInput, RateLimited, Unavailable
from core.ids import time_ordered, uuid7
from core.load_report import LoadReport
from core.models.sim import SimSpec
from core.shed import shed_error
from core.vocab import RequestStatus
from ingest.acceptance.inputs import (
    default_timeout_ms,
    item_request_id,
    raise_if_unsuccessful,
    validate_each,
)
from ingest.admission.policy import check_rate, check_timeout_floor
from ingest.admission.ratelimit import TenantLimiter
from ingest.admission.view import LoadView
from results.requests import AnswerRow
from results.tenants import Tenant


def test_ids_derive_from_the_first_stably_and_distinctly() -> None:
    first = str(uuid.uuid4())
    ids = [item_request_id(first, i) for i in range(3)]
    assert ids == [item_request_id(first, i) for i in range(3)]
    assert ids[0] == first and len(set(ids)) == 3
    assert all(str(uuid.UUID(i)) == i for i in ids)  # canonical: /v1/requests/{id} finds them
    assert item_request_id(str(uuid.uuid4()), 1) != ids[1]


def test_an_order_of_many_inputs_names_time_ordered_rows_beside_its_first() -> None:
    first = uuid7(1_796_000_000_000)
    ids = [item_request_id(first, i) for i in range(64)]
    assert ids[0] == first
    assert len(set(ids)) == 64
    assert all(time_ordered(i) and i[:13] == first[:13] for i in ids)


def test_a_request_first_made_with_a_random_id_keeps_its_item_ids() -> None:
    # A retry, after an upgrade, of a request accepted before decision 72 must name the
    # rows its first attempt did.
    first = str(uuid.uuid4())
    assert item_request_id(first, 3) == str(uuid.uuid5(uuid.UUID(first), "3"))
    assert item_request_id(first, 0) == first


def test_validate_each_names_the_input() -> None:
    spec = SimSpec(name="sim", version="1", max_batch_size=8, max_input_chars=10)
    validate_each(spec, ["a", "b"], lambda i: f"input[{i}]")
    with pytest.raises(InvalidInput) as e:
        validate_each(spec, ["a", "   "], lambda i: f"input[{i}]")
    assert e.value.field == "input[1]" and e.value.message.startswith("input[1]")
    with pytest.raises(InvalidInput) as e:
        validate_each(spec, ["a" * 11], lambda i: "input")
    assert e.value.field == "input"


def test_many_inputs_cost_one_token_each_and_are_not_refused_for_size() -> None:
    s = Settings(
        tier_rate_rps={"free": 1, "paid": 2, "enterprise": 3},
        tier_burst={"free": 4, "paid": 5, "enterprise": 6},
    )
    limiter = TenantLimiter()
    t = Tenant(id="t", name="t", tier="free")
    # Larger than the burst (4): taken while the bucket holds tokens, leaving it in debt.
    check_rate(limiter, s, t, items=10)
    with pytest.raises(RateLimited) as e:
        check_rate(limiter, s, t)
    assert e.value.retry_after_s is not None and e.value.retry_after_s > 5


def test_the_default_deadline_grows_with_the_batches_the_inputs_fill() -> None:
    assert default_timeout_ms(2000, 1, 256, 300_000) == 2000
    assert default_timeout_ms(2000, 256, 256, 300_000) == 2000
    assert default_timeout_ms(2000, 257, 256, 300_000) == 4000
    assert default_timeout_ms(2000, 2048, 256, 300_000) == 16_000
    assert default_timeout_ms(2000, 2048, 1, 300_000) == 300_000


# ---- a deadline no batch can meet, and a request the scheduler shed (decision 62) -------
def _view(single_ms: float) -> LoadView:
    shape = {"items_s": 200.0, "batch": 10, "batch_ms": 100.0, "single_ms": single_ms}
    return LoadView.combine([LoadReport({"sim@1": {**shape, "workers": 2}}, {}, {}, {})])


@pytest.mark.parametrize(
    ("single_ms", "asked_ms", "field"),
    [
        (100.0, 1, "timeout_ms"),
        (100.0, 119, "timeout_ms"),
        (7.0, 26, "parameters.timeout"),
        (2000.0, 1999, "grpc-timeout"),
    ],
)
def test_a_timeout_below_what_any_batch_takes_is_a_400_naming_it_and_the_minimum(
    single_ms: float, asked_ms: int, field: str
) -> None:
    s = Settings()
    floor = math.ceil(single_ms + s.deadline_margin_ms)
    with pytest.raises(InvalidInput) as e:
        check_timeout_floor(_view(single_ms), s, "sim@1", asked_ms, field)
    assert e.value.status == 400 and e.value.field == field
    assert "timeout_ms" in e.value.message and f"minimum of {floor} ms" in e.value.message
    check_timeout_floor(_view(single_ms), s, "sim@1", floor, field)  # the floor itself is fine


def test_before_any_report_the_floor_is_the_margin() -> None:
    s = Settings()
    with pytest.raises(InvalidInput):
        check_timeout_floor(None, s, "sim@1", s.deadline_margin_ms - 1)
    check_timeout_floor(None, s, "sim@1", s.deadline_margin_ms)
    check_timeout_floor(_view(100.0), s, "other@1", s.deadline_margin_ms)  # unreported model


def _row(status: RequestStatus, error: str | None) -> AnswerRow:
    return cast(AnswerRow, {"status": status, "error": error})


@pytest.mark.parametrize("retry", [1.0, 2.4, 5.0])
def test_a_request_shed_by_the_scheduler_is_a_503_with_its_retry_after(retry: float) -> None:
    with pytest.raises(Unavailable) as e:
        raise_if_unsuccessful(_row(RequestStatus.EXPIRED, shed_error(retry)))
    assert e.value.status == 503 and e.value.retry_after_s == math.ceil(retry)
    assert e.value.reason == "shed"


def test_a_request_expired_at_its_deadline_is_still_a_504() -> None:
    with pytest.raises(DeadlineExceeded):
        raise_if_unsuccessful(_row(RequestStatus.EXPIRED, "deadline passed before a worker ran it"))
    raise_if_unsuccessful(_row(RequestStatus.SUCCEEDED, None))
