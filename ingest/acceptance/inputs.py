"""A many-input request's inputs: each one's checks, its request id, the deadline when
the caller sets none, and the error of one that did not succeed. Pure; every door
shares them through the acceptance pipeline (pipeline.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from core.errors import DeadlineExceeded, InvalidInput, ModelError, Unavailable
from core.ids import derived_uuid7, time_ordered
from core.models.spec import ModelSpec
from core.shed import shed_retry_after_s
from core.vocab import RequestStatus
from results.requests import AnswerRow


def validate_each(spec: ModelSpec, inputs: list[Any], field_of: Callable[[int], str]) -> None:
    """The model's checks on every input; an error names the input it is about."""
    for i, value in enumerate(inputs):
        try:
            spec.validate_input(value)
        except InvalidInput as exc:
            where = field_of(i)
            raise InvalidInput(exc.message.replace("input", where, 1), field=where) from None


def raise_if_unsuccessful(row: AnswerRow, field: str = "input") -> None:
    """The error a finished request's caller gets when it failed or expired: a request
    the scheduler shed before its deadline is a 503 with Retry-After (decision 62)."""
    if row["status"] == RequestStatus.EXPIRED:
        retry = shed_retry_after_s(row.get("error"))
        if retry is not None:
            raise Unavailable(
                "overloaded: the scheduler dropped this request unrun, as the work queued "
                "ahead of it would outlast its deadline; retry later",
                retry_after_s=retry,
                reason="shed",
            )
        raise DeadlineExceeded(
            "the deadline passed before a worker could run the request", reason="expired"
        )
    if row["status"] == RequestStatus.FAILED:
        raise ModelError(f"the model failed on this input: {row['error']}", field=field)


def item_request_id(first: str, index: int) -> str:
    """Input ``index``'s request id, from input 0's (which an Idempotency-Key claims):
    every retry of the request names the same rows. A time-ordered first id (decision
    72) gives ids with its time; one made before that, a UUIDv5 as it always did."""
    if index == 0:
        return first
    if time_ordered(first):
        return derived_uuid7(first, str(index))
    return str(uuid.uuid5(uuid.UUID(first), str(index)))


def default_timeout_ms(slo_ms: int, n: int, max_batch: int, max_timeout_ms: int) -> int:
    """The deadline of ``n`` inputs when the client sets none: the tier's SLO for each
    batch they fill at least (n / the model's largest batch, rounded up), since one
    worker runs those batches one after another; never past ``max_timeout_ms``."""
    return min(max_timeout_ms, slo_ms * -(-n // max_batch))
