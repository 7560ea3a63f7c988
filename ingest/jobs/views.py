"""How jobs and their items look in the API's answers."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from core.vocab import ItemStatus
from results.jobs import counts, item_status, job_status, usage
from results.vectors import EncodingFormat, answer_output


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t else None


def webhook_view(j: Any) -> dict[str, Any] | None:
    """The delivery's state; a failure reads as its status class ("timeout",
    "http_5xx", "refused_destination"...), never as an exception's text."""
    if not j.webhook_url:
        return None
    return {
        "url": j.webhook_url,
        "delivered_at": _iso(j.webhook_delivered_at),
        "attempts": j.webhook_attempts,
        "error": j.webhook_error,
        "gave_up": j.webhook_delivered_at is None
        and j.webhook_next_at is None
        and j.webhook_attempts > 0,
    }


def job_summary(j: Any, now: datetime, eta: int | None = None) -> dict[str, Any]:
    """``eta``: the job's completion-time quote, unix seconds (ingest/jobs/estimates.py)."""
    c = counts(j)
    return {
        "job_id": str(j.job_id),
        "status": job_status(j, now),
        "model": j.model,
        "model_version": j.model_version,
        "params": j.params,
        "metadata": j.metadata,
        "counts": c,
        "usage": usage(j),
        "base_job_id": str(j.base_job_id) if j.base_job_id else None,
        "progress": round((c["total"] - c["queued"]) / c["total"], 4) if c["total"] else 1.0,
        "created_at": _iso(j.created_at),
        "started_at": _iso(j.started_at),
        "finished_at": _iso(j.finished_at),
        "cancelled_at": _iso(j.cancelled_at),
        "expires_at": _iso(j.expires_at),
        "estimated_completion_at": eta,
        "attempt": j.attempt,
        "webhook": webhook_view(j),
    }


def item_view(r: Any, j: Any, now: datetime) -> dict[str, Any]:
    status = item_status(r.status, j, now)
    return {
        "index": r.item_index,
        "custom_id": r.custom_id,
        "status": status,
        "output": answer_output(r.output, r.output_vector, EncodingFormat.FLOAT)
        if status == ItemStatus.SUCCEEDED
        else None,
        "error": r.error,
        "attempts": r.attempts or 0,
        "reused": r.reused,  # its result came from the base job, not computed
    }
