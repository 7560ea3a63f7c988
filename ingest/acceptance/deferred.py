"""The 202 of a flex request not done within its caller's patience (decision 66): it is
accepted and runs on; ``Location`` says where its answer will be, and its completion
quote when it will be (decision 69), as a job's 202 carries it."""

from __future__ import annotations

from typing import Any

from ingest.acceptance.pipeline import Outcome
from ingest.edge.json_response import ORJSONResponse

# The quote in unix seconds, as the body's ``estimated_completion_at``.
COMPLETION_HEADER = "Gristmill-Estimated-Completion-At"


def completion_headers(quote: int | None) -> dict[str, str]:
    return {} if quote is None else {COMPLETION_HEADER: str(quote)}


def quoted(outcome: Outcome, body: dict[str, Any], headers: dict[str, str]) -> None:
    """A flex 202's quote added to its body and headers (none: no worker serves it)."""
    body["estimated_completion_at"] = outcome.quote
    headers.update(completion_headers(outcome.quote))


def deferred_answer(outcome: Outcome, where: str, content: dict[str, Any]) -> ORJSONResponse:
    """202 with ``Location: where``, the body ``content`` plus the request's status and
    service tier, and the answer's usual headers (RateLimit-*, X-Service-Tier)."""
    body = {**content, "status": "in_progress", "service_tier": outcome.served}
    headers = {**outcome.limit_headers, "Location": where}
    quoted(outcome, body, headers)
    return ORJSONResponse(body, status_code=202, headers=headers)
