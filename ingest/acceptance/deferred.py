"""The 202 of a flex request not done within its caller's patience (decision 66): it is
accepted and runs on; ``Location`` says where its answer will be."""

from __future__ import annotations

from typing import Any

from fastapi.responses import ORJSONResponse

from ingest.acceptance.pipeline import Outcome


def deferred_answer(outcome: Outcome, where: str, content: dict[str, Any]) -> ORJSONResponse:
    """202 with ``Location: where``, the body ``content`` plus the request's status and
    service tier, and the answer's usual headers (RateLimit-*, X-Service-Tier)."""
    body = {**content, "status": "in_progress", "service_tier": outcome.served}
    headers = {**outcome.limit_headers, "Location": where}
    return ORJSONResponse(body, status_code=202, headers=headers)
