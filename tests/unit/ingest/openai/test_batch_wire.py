"""OpenAI batch lines, ids, windows and statuses (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from core.errors import InvalidInput, NotFound
from ingest.openai import batch_wire as bw


def line(url: str = bw.EMBEDDINGS, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": "a",
        "method": "POST",
        "url": url,
        "body": {"model": "m", "input": "hello", **body},
    }


def refused(obj: Any, endpoint: str = bw.EMBEDDINGS, n: int = 3) -> InvalidInput:
    with pytest.raises(InvalidInput) as exc:
        bw.parse_line(obj, n, endpoint)
    return exc.value


def test_an_embeddings_line_becomes_one_item() -> None:
    got = bw.parse_line(line(encoding_format="base64"), 1, bw.EMBEDDINGS)
    assert (got.custom_id, got.model, got.input, got.params, got.encoding) == (
        "a",
        "m",
        "hello",
        None,
        "base64",
    )
    assert bw.parse_line(line(input=["one"]), 1, bw.EMBEDDINGS).input == "one"
    assert bw.parse_line(line(), 1, bw.EMBEDDINGS).encoding == "float"


def test_a_completions_line_carries_its_sampling_params() -> None:
    obj = {
        "custom_id": "g",
        "method": "POST",
        "url": bw.COMPLETIONS,
        "body": {"model": "lm", "prompt": ["hi"], "max_tokens": 5, "temperature": 0},
    }
    got = bw.parse_line(obj, 1, bw.COMPLETIONS)
    assert got.input == "hi" and got.params == {"max_tokens": 5, "temperature": 0}


def test_an_infer_line_passes_input_and_params() -> None:
    got = bw.parse_line(line(bw.INFER, input=[1, 2], params={"k": 1}), 1, bw.INFER)
    assert got.input == [1, 2] and got.params == {"k": 1}


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        ([1, 2], "line 3"),
        ({**line(), "extra": 1}, "line 3"),
        ({**line(), "custom_id": ""}, "line 3.custom_id"),
        ({**line(), "custom_id": 7}, "line 3.custom_id"),
        ({**line(), "method": "GET"}, "line 3.method"),
        (line(bw.COMPLETIONS), "line 3.url"),
        ({**line(), "body": "x"}, "line 3.body"),
        (line(input=["a", "b"]), "line 3.body.input"),
        (line(input=3), "line 3.body.input"),
        (line(encoding_format="int8"), "line 3.body.encoding_format"),
        (line(dimensions=8), "line 3.body.dimensions"),
        (line(temperature=1), "line 3.body.temperature"),
        (line(model=""), "line 3.body.model"),
        ({**line(), "body": {"model": "m"}}, "line 3.body.input"),
    ],
)
def test_bad_lines_are_refused_naming_line_and_field(obj: Any, field: str) -> None:
    assert refused(obj).field == field


def test_a_completion_line_with_n_or_no_prompt_is_refused() -> None:
    base = {"custom_id": "g", "method": "POST", "url": bw.COMPLETIONS}
    assert refused({**base, "body": {"model": "lm"}}, bw.COMPLETIONS).field == (
        "line 3.body.prompt"
    )
    obj = {**base, "body": {"model": "lm", "prompt": "x", "n": 2}}
    assert refused(obj, bw.COMPLETIONS).field == "line 3.body.n"


def test_lines_must_agree_and_custom_ids_be_unique() -> None:
    checks = bw.LineChecks()
    checks.check(bw.BatchLine("a", "m", "x", None, "float"), 1)
    with pytest.raises(InvalidInput) as exc:
        checks.check(bw.BatchLine("a", "m", "y", None, "float"), 2)
    assert exc.value.field == "line 2.custom_id"
    with pytest.raises(InvalidInput) as exc:
        checks.check(bw.BatchLine("b", "other", "y", None, "float"), 3)
    assert exc.value.field == "line 3.body.model"
    with pytest.raises(InvalidInput) as exc:
        checks.check(bw.BatchLine("c", "m", "y", None, "base64"), 4)
    assert exc.value.field == "line 4.body"
    checks.check(bw.BatchLine("d", "m", "y", None, "float"), 5)


@pytest.mark.parametrize(
    ("value", "seconds"), [("24h", 86_400), ("30m", 1_800), ("2d", 172_800), ("90s", 90)]
)
def test_completion_windows(value: str, seconds: int) -> None:
    assert bw.completion_window_s(value, 7 * 86_400) == seconds


@pytest.mark.parametrize("value", ["24", "h", "0h", "1w", "-1h", "24 h", "8d"])
def test_bad_completion_windows(value: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        bw.completion_window_s(value, 7 * 86_400)
    assert exc.value.field == "completion_window"


def test_output_expiry() -> None:
    t = datetime(2026, 1, 1, tzinfo=UTC)
    assert bw.output_expiry(None, t) is None
    got = bw.output_expiry({"anchor": "created_at", "seconds": 7200}, t)
    assert got == t + timedelta(hours=2)
    for bad in ({"anchor": "x", "seconds": 7200}, {"anchor": "created_at", "seconds": 5}, 3):
        with pytest.raises(InvalidInput):
            bw.output_expiry(bad, t)


def test_ids_round_trip_and_strangers_are_404() -> None:
    jid = "0b7c5d3e-8a6f-4c1e-9d2a-5f4e3b2a1c0d"
    bid = bw.batch_id_for(jid)
    assert bid == "batch_0b7c5d3e8a6f4c1e9d2a5f4e3b2a1c0d" and bw.job_id_for(bid) == jid
    assert bw.result_file(bw.output_file_id(bid)) == (bid, False)
    assert bw.result_file(bw.error_file_id(bid)) == (bid, True)
    assert bw.result_file(bw.new_file_id()) is None
    for bad in ("batch_xyz", jid, "batch_" + "A" * 32):
        with pytest.raises(NotFound):
            bw.job_id_for(bad)


@pytest.mark.parametrize(
    ("job", "submit", "batch"),
    [
        ("queued", "submitting", "validating"),
        ("queued", "submitted", "in_progress"),
        ("running", "submitted", "in_progress"),
        ("completed", "submitted", "completed"),
        ("failed", "submitted", "completed"),  # all items failed: an error file, as OpenAI
        ("cancelling", "submitted", "cancelling"),
        ("cancelled", "submitted", "cancelled"),
        ("expired", "submitted", "expired"),
    ],
)
def test_status_mapping(job: str, submit: str, batch: str) -> None:
    assert bw.batch_status(job, submit) == batch
    assert batch in bw.BATCH_STATUSES


def test_request_counts_fold_unsuccessful_into_failed() -> None:
    c = {"total": 10, "queued": 1, "succeeded": 5, "failed": 1, "expired": 2, "cancelled": 1}
    assert bw.request_counts(c) == {"total": 10, "completed": 5, "failed": 4}


def test_output_and_error_lines_in_openais_shape() -> None:
    rid = "0b7c5d3e-8a6f-4c1e-9d2a-5f4e3b2a1c0d"
    ok = bw.output_line("x", rid, {"object": "list"})
    assert ok == {
        "id": "batch_req_0b7c5d3e8a6f4c1e9d2a5f4e3b2a1c0d",
        "custom_id": "x",
        "response": {"status_code": 200, "request_id": rid, "body": {"object": "list"}},
        "error": None,
    }
    bad = bw.error_line("y", rid, "expired", None)
    assert bad["error"] == {"code": "batch_expired", "message": "the request expired"}
    assert bad["response"]["status_code"] == 408
    assert bw.error_line("y", rid, "failed", "boom")["error"]["message"] == "boom"


def test_batch_object_names_its_files_and_times() -> None:
    t = datetime(2026, 1, 1, tzinfo=UTC)
    b = SimpleNamespace(
        batch_id="batch_" + "1" * 32,
        endpoint=bw.EMBEDDINGS,
        input_file_id="file-x",
        completion_window="24h",
        created_at=t,
        metadata={"k": "v"},
    )
    j = SimpleNamespace(
        created_at=t,
        started_at=t,
        finished_at=t + timedelta(seconds=5),
        cancelled_at=None,
        expires_at=t + timedelta(days=1),
        model="m",
        reused=1,
    )
    c = {"total": 2, "queued": 0, "succeeded": 1, "failed": 1, "expired": 0, "cancelled": 0}
    o = bw.batch_object(b, j, status="completed", counts=c, has_errors=True)
    assert o["object"] == "batch" and o["status"] == "completed"
    assert o["output_file_id"] == bw.output_file_id(b.batch_id)
    assert o["error_file_id"] == bw.error_file_id(b.batch_id)
    assert o["completed_at"] == int(t.timestamp()) + 5
    assert o["request_counts"] == {"total": 2, "completed": 1, "failed": 1, "reused": 1}
    v = bw.batch_object(b, j, status="validating", counts=c, has_errors=False)
    assert v["output_file_id"] is None and v["error_file_id"] is None


def test_files_and_batches_answer_errors_in_openais_shape() -> None:
    from ingest.edge.error_shapes import Shape, shape_for

    for path in ("/v1/files", "/v1/files/file-1/content", "/v1/batches", "/v1/batches/b/cancel"):
        assert shape_for(path) is Shape.OPENAI
    assert shape_for("/v1/filesx") is Shape.GRISTMILL
