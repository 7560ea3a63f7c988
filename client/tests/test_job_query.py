"""A JSONL job's options travel in the query string."""

from __future__ import annotations

from gristmill_client.client import _job_query


def test_a_base_job_is_sent_only_when_named() -> None:
    assert _job_query("sim", None, None, None) == {"model": "sim"}
    q = _job_query("sim", {"salt": "s"}, 60, None, "0190c1f2-0000-0000-0000-000000000001")
    assert q == {
        "model": "sim",
        "params": '{"salt":"s"}',
        "completion_window_s": "60",
        "base_job_id": "0190c1f2-0000-0000-0000-000000000001",
    }
