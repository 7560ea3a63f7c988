"""ingest/metrics.py: what one answer adds, by tier, status code and reason."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import psycopg

from core.errors import RateLimited, Unavailable
from core.messages import RequestMessage
from core.metrics import snapshot
from core.vocab import RequestStatus
from ingest import metrics


def added(before: dict[str, float], name: str, **labels: str) -> float:
    return snapshot(metrics.REGISTRY).get(name, **labels) - before.get(name, 0.0)


def test_refusals_are_counted_by_tier_code_and_reason() -> None:
    token = metrics.request_tier.set("free")
    try:
        snap = snapshot(metrics.REGISTRY)
        base = {
            "429": snap.get("gristmill_admission_total", tier="free", outcome="429"),
            "kafka": snap.get("gristmill_admission_total", tier="free", reason="kafka"),
            "db": snap.get("gristmill_admission_total", tier="free", reason="database"),
            "200": snap.get("gristmill_api_responses_total", tier="free", code="200"),
        }
        metrics.responded(429, RateLimited("over"))
        metrics.responded(503, Unavailable("down", reason="kafka"))
        metrics.responded(503, psycopg.OperationalError("gone"))
        metrics.responded(200, None)
        metrics.responded(422, None)  # a client's mistake: a response, not an admission outcome
        snap = snapshot(metrics.REGISTRY)
        assert snap.get("gristmill_admission_total", tier="free", outcome="429") - base["429"] == 1
        assert (
            snap.get("gristmill_admission_total", tier="free", reason="kafka") - base["kafka"] == 1
        )
        assert (
            snap.get("gristmill_admission_total", tier="free", reason="database") - base["db"] == 1
        )
        assert snap.get("gristmill_api_responses_total", tier="free", code="200") - base["200"] == 1
        assert snap.get("gristmill_admission_total", tier="free", outcome="422") == 0
    finally:
        metrics.request_tier.reset(token)
    assert metrics.request_tier.get() == "none"  # before authentication


def test_an_answer_observes_total_and_respond_only_when_it_succeeded() -> None:
    now = time.time()
    msg = RequestMessage("r", "t", "enterprise", "sim", "7", "x", {}, now + 1, now - 0.3)
    row = {
        "status": RequestStatus.SUCCEEDED,
        "persisted_at": datetime.fromtimestamp(now - 0.01, UTC),
    }
    labels = {"model": "sim", "version": "7", "class": "enterprise"}
    before = snapshot(metrics.REGISTRY)
    metrics.answered(msg, row, now)
    metrics.answered(msg, {**row, "status": RequestStatus.EXPIRED}, now)
    after = snapshot(metrics.REGISTRY)
    total = after.get("gristmill_request_duration_seconds_count", **labels) - before.get(
        "gristmill_request_duration_seconds_count", **labels
    )
    assert total == 1
    # 300 ms: inside the 0.5 s bucket, not the 0.2 s one
    assert after.get("gristmill_request_duration_seconds_bucket", le="0.5", **labels) == 1
    assert after.get("gristmill_request_duration_seconds_bucket", le="0.2", **labels) == 0
    respond = after.get("gristmill_stage_duration_seconds_sum", stage="respond", **labels)
    assert 0.009 < respond < 0.05
