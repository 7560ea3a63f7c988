"""Rows of a planned write, and the failed row a refused row becomes (scheduler/runtime/rows.py)."""

from __future__ import annotations

import numpy as np
import orjson

from core.messages import REPLY_TO, SERVICE_TIER
from core.vocab import RequestStatus
from results.db import reply_channel
from results.faults import NUL_ESCAPE
from results.schema import REQUEST_ROW_COLUMNS
from results.store import column_arrays
from results.vectors import to_floats
from scheduler.core.batcher import Batch, BatchKey
from scheduler.core.plans import Write
from scheduler.runtime.rows import unstorable, write_rows
from tests.unit.helpers import pending

KEY = BatchKey("sim", "1", (("salt", "a\x00b"),))


def test_a_succeeded_write_builds_its_items_rows_and_the_batch_row() -> None:
    items = [pending(key=KEY) for _ in range(3)]
    batch = Batch(KEY, items, 1.0, "full")
    w = Write(
        priority=1,
        status=RequestStatus.SUCCEEDED,
        items=items[1:],
        batch=batch,
        outputs=["o1", "o2"],
        compute=(2.0, 2.5),
        worker_id="w0",
        batch_row=True,
    )
    rows, brow = write_rows(w)
    assert [r["request_id"] for r in rows] == [p.msg.request_id for p in items[1:]]
    assert [r["output"] for r in rows] == ["o1", "o2"]
    assert all(r["batch_size"] == 3 and r["batch_id"] == batch.batch_id for r in rows)
    assert brow is not None and brow["size"] == 3 and brow["compute_ms"] == 500.0


def test_a_recorded_write_has_no_batch_row() -> None:
    p = pending()
    rows, brow = write_rows(
        Write(priority=0, status=RequestStatus.EXPIRED, items=[p], error="late")
    )
    assert brow is None and rows[0]["status"] == "expired" and rows[0]["error"] == "late"


def test_a_refused_row_becomes_a_readable_failed_row() -> None:
    p = pending(key=KEY, input_="in\x00put")
    (row,), _ = write_rows(
        Write(
            1,
            RequestStatus.SUCCEEDED,
            [p],
            batch=Batch(KEY, [p], 1.0, "full"),
            outputs=[{"x": "\x00"}],
            compute=(1.0, 1.1),
        )
    )
    out = unstorable(row, "PostgreSQL text fields cannot contain NUL (0x00) bytes")
    assert out["status"] == "failed"
    assert out["error"] == (
        "the result could not be stored: PostgreSQL text fields cannot contain NUL (0x00) bytes"
    )
    assert out["input"] == f"in{NUL_ESCAPE}put" and out["params"] == {"salt": f"a{NUL_ESCAPE}b"}
    assert out["output"] == {"x": NUL_ESCAPE}
    assert out["request_id"] == row["request_id"] and out["received_at"] == row["received_at"]
    assert "\\u0000" not in orjson.dumps(out["params"]).decode().replace("\\\\u0000", "")


def test_a_refused_batch_row_keeps_its_status() -> None:
    batch = Batch(KEY, [pending(key=KEY)], 1.0, "full")
    w = Write(
        1,
        RequestStatus.SUCCEEDED,
        batch.items,
        batch=batch,
        outputs=[1],
        compute=(1, 2),
        batch_row=True,
    )
    _, brow = write_rows(w)
    assert brow is not None and "\x00" in brow["batch_key"]
    out = unstorable(brow, "NUL")
    assert out["status"] == "succeeded" and out["batch_key"] == f"sim@1[salt=a{NUL_ESCAPE}b]"


def test_an_array_of_outputs_becomes_one_float32_vector_per_row() -> None:
    items = [pending(key=KEY) for _ in range(3)]
    batch = Batch(KEY, items, 1.0, "full")
    outputs = np.arange(3 * 384, dtype=np.float32).reshape(3, 384) / 1000
    rows, _ = write_rows(
        Write(1, RequestStatus.SUCCEEDED, items, batch=batch, outputs=outputs, compute=(1, 2))
    )
    assert all(r["output"] is None for r in rows)
    for r, want in zip(rows, outputs, strict=True):
        assert r["output_vector"] is not None and len(r["output_vector"]) == 384 * 4
        assert to_floats(r["output_vector"]) == want.tolist()


def test_json_outputs_have_no_vector_and_recorded_rows_neither() -> None:
    p = pending(key=KEY)
    (row,), _ = write_rows(
        Write(
            1,
            RequestStatus.SUCCEEDED,
            [p],
            batch=Batch(KEY, [p], 1.0, "full"),
            outputs=[[0.5, 0.25]],
            compute=(1, 2),
        )
    )
    assert row["output"] == [0.5, 0.25] and row["output_vector"] is None
    (failed,), _ = write_rows(Write(0, RequestStatus.FAILED, [p], error="x"))
    assert failed["output_vector"] is None


def test_a_row_says_which_service_tier_ran_its_request() -> None:
    """Decision 66: the request log meters flex apart from the sync tiers."""
    flex, plain, job = pending(), pending(), pending()
    flex.msg.extra[SERVICE_TIER] = "flex"
    job.msg.job_id = "00000000-0000-4000-8000-0000000000aa"
    rows, _ = write_rows(
        Write(priority=3, status=RequestStatus.EXPIRED, items=[flex, plain, job], error="late")
    )
    assert [r["service_tier"] for r in rows] == ["flex", None, None]


def test_a_row_names_the_reply_channel_its_message_gave_if_the_api_could_have() -> None:
    """Decision 70: the answer goes to the waiting API process's channel; a message is
    data, so a channel the API could not have named is dropped (the shared one is used)."""
    own, other, none, odd = pending(), pending(), pending(), pending()
    own.msg.extra[REPLY_TO] = reply_channel("abc123")
    other.msg.extra[REPLY_TO] = "gristmill_models"
    odd.msg.extra[REPLY_TO] = ["not", "a", "name"]
    rows, _ = write_rows(
        Write(priority=1, status=RequestStatus.EXPIRED, items=[own, other, none, odd], error="x")
    )
    assert [r.get("reply_to") for r in rows] == [reply_channel("abc123"), None, None, None]
    assert column_arrays(rows)  # the channel is not a column: the insert takes the rows
    assert "reply_to" not in REQUEST_ROW_COLUMNS
