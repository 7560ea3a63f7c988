"""The error tree. Each error knows its HTTP status; ingest maps them in one place.

Client mistakes are 4xx and name the problem; dependency trouble is 503 with a
Retry-After. The root's 500 is only for bugs: ingest/edge/http.py answers those with a
reference id and logs the stack, never the exception's text.
"""

from __future__ import annotations


class GristmillError(Exception):
    status: int = 500
    code: str = "internal_error"
    # Why, in a word from a short fixed list: the label of refusal metrics (429, 503,
    # 504 by tier and reason) and of the request log's refusals. Defaults to ``code``.
    reason: str = ""

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        retry_after_s: float | None = None,
        headers: dict[str, str] | None = None,
        reason: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.reason = reason or type(self).reason or self.code
        self.field = field
        self.retry_after_s = retry_after_s
        self.headers = headers or {}

    def to_body(self) -> dict[str, object]:
        body: dict[str, object] = {"code": self.code, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        return {"error": body}


class InvalidInput(GristmillError):
    status, code = 400, "invalid_input"


class SchemaViolation(GristmillError):
    status, code = 422, "schema_violation"


class IdempotencyConflict(GristmillError):
    status, code = 422, "idempotency_key_reused"


class Unauthorized(GristmillError):
    status, code = 401, "unauthorized"


class Forbidden(GristmillError):
    status, code = 403, "forbidden"


class QuotaExceeded(GristmillError):
    """What the tenant keeps is at its plan's bound (stored files and bytes): waiting
    does not help, deleting does (so not a 429, which clients retry)."""

    status, code = 403, "quota_exceeded"


class NotFound(GristmillError):
    status, code = 404, "not_found"


class RequestTimeout(GristmillError):
    """The client stopped sending its request body."""

    status, code = 408, "request_timeout"


class Conflict(GristmillError):
    """The request is valid but the resource's state does not allow it now (promoting a
    retired model version, registering one that exists)."""

    status, code = 409, "conflict"


class PayloadTooLarge(GristmillError):
    status, code = 413, "payload_too_large"


class RateLimited(GristmillError):
    status, code = 429, "rate_limited"
    reason = "tenant_rate"


class Unavailable(GristmillError):
    """A dependency (Kafka, PostgreSQL, workers) cannot take the work right now."""

    status, code = 503, "unavailable"


class DeadlineExceeded(GristmillError):
    status, code = 504, "deadline_exceeded"
    reason = "deadline"  # "expired": dropped before compute, not waited out


class ModelError(GristmillError):
    """The model failed on this input (recorded per request, not an HTTP failure of ours)."""

    status, code = 422, "model_error"
