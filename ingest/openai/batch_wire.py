"""OpenAI's Batch API on Gristmill's jobs, the pure half: reading an input file's lines,
the ids, the statuses, the completion window and the output/error lines (decision 35).
No I/O; the clock is passed in."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from core.errors import InvalidInput, NotFound
from core.vocab import ItemStatus, JobStatus
from ingest.jobs.schemas import check_custom_id

EMBEDDINGS = "/v1/embeddings"
COMPLETIONS = "/v1/completions"
INFER = "/v1/infer"
ENDPOINTS = (EMBEDDINGS, COMPLETIONS, INFER)

FILE_PREFIX = "file-"
BATCH_PREFIX = "batch_"
# A batch's output and error files are views of its job's results (never copied):
# their ids name the batch.
OUTPUT_SUFFIX = "-output"
ERRORS_SUFFIX = "-errors"

# OpenAI's bounds on output_expires_after.seconds (1 hour .. 30 days).
MIN_OUTPUT_EXPIRY_S = 3_600
MAX_OUTPUT_EXPIRY_S = 30 * 86_400

_WINDOW = re.compile(r"^([1-9][0-9]{0,6})(s|m|h|d)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3_600, "d": 86_400}

# Keys a body may hold per endpoint; anything else is refused naming it.
_EMBEDDING_KEYS = {"model", "input", "encoding_format", "dimensions", "user"}
_COMPLETION_KEYS = {"model", "prompt", "max_tokens", "temperature", "seed", "stop", "user", "n"}
_INFER_KEYS = {"model", "input", "params", "timeout_ms"}


def new_file_id() -> str:
    return FILE_PREFIX + uuid.uuid4().hex


def batch_id_for(job_id: str) -> str:
    return BATCH_PREFIX + uuid.UUID(job_id).hex


def job_id_for(batch_id: str) -> str:
    """The job a batch id names; 404 for anything that is not one of ours."""
    hexpart = batch_id.removeprefix(BATCH_PREFIX)
    if hexpart == batch_id or not re.fullmatch(r"[0-9a-f]{32}", hexpart):
        raise NotFound(f"no batch {batch_id[:80]!r}")
    return str(uuid.UUID(hexpart))


def output_file_id(batch_id: str) -> str:
    return FILE_PREFIX + batch_id + OUTPUT_SUFFIX


def error_file_id(batch_id: str) -> str:
    return FILE_PREFIX + batch_id + ERRORS_SUFFIX


def result_file(file_id: str) -> tuple[str, bool] | None:
    """(batch id, errors?) when ``file_id`` names a batch's output or error file."""
    rest = file_id.removeprefix(FILE_PREFIX)
    if not rest.startswith(BATCH_PREFIX):
        return None
    for suffix, errors in ((OUTPUT_SUFFIX, False), (ERRORS_SUFFIX, True)):
        if rest.endswith(suffix):
            return rest.removesuffix(suffix), errors
    return None


def completion_window_s(value: str, max_s: int) -> int:
    """ "24h" (OpenAI's only value) and any other "<n>s|m|h|d" up to ``max_s`` seconds."""
    m = _WINDOW.match(value) if isinstance(value, str) else None
    if m is None:
        raise InvalidInput(
            f"completion_window must look like '24h' (a number and s, m, h or d), got {value!r}",
            field="completion_window",
        )
    seconds = int(m.group(1)) * _UNIT_S[m.group(2)]
    if seconds > max_s:
        raise InvalidInput(
            f"completion_window may be at most {max_s} s; got {seconds} s",
            field="completion_window",
        )
    return seconds


def output_expiry(value: Any, created: datetime) -> datetime | None:
    """OpenAI's ``output_expires_after``: {"anchor": "created_at", "seconds": N}."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"anchor", "seconds"}:
        raise InvalidInput(
            "output_expires_after must be {'anchor': 'created_at', 'seconds': N}",
            field="output_expires_after",
        )
    if value["anchor"] != "created_at":
        raise InvalidInput(
            "output_expires_after.anchor must be 'created_at'", field="output_expires_after.anchor"
        )
    s = value["seconds"]
    if (
        not isinstance(s, int)
        or isinstance(s, bool)
        or not (MIN_OUTPUT_EXPIRY_S <= s <= MAX_OUTPUT_EXPIRY_S)
    ):
        raise InvalidInput(
            f"output_expires_after.seconds must be an integer {MIN_OUTPUT_EXPIRY_S}.."
            f"{MAX_OUTPUT_EXPIRY_S}",
            field="output_expires_after.seconds",
        )
    return created + timedelta(seconds=s)


@dataclass(frozen=True)
class BatchLine:
    """One request line, checked: the job item it becomes and the job-level options it
    implies (the same for every line of one batch)."""

    custom_id: str
    model: str
    input: Any
    params: dict[str, Any] | None  # the model's params, before the model normalises them
    encoding: str  # embeddings: "float" or "base64"; others: ""


def _one_text(value: Any, where: str, what: str) -> Any:
    """A string, or a list holding one string (one item per line)."""
    if isinstance(value, list):
        if len(value) != 1:
            raise InvalidInput(
                f"{where}: a batch line holds one {what}; put each on its own line",
                field=where,
            )
        value = value[0]
    if not isinstance(value, str):
        raise InvalidInput(f"{where} must be a string", field=where)
    return value


def parse_line(obj: Any, n: int, endpoint: str) -> BatchLine:
    """A line of the input file as OpenAI's: {"custom_id", "method": "POST", "url",
    "body"}; every refusal names ``line n`` and the field."""
    where = f"line {n}"
    if not isinstance(obj, dict):
        raise InvalidInput(f"{where}: each line must be a JSON object", field=where)
    extra = set(obj) - {"custom_id", "method", "url", "body"}
    if extra:
        raise InvalidInput(f"{where}: unknown field {sorted(extra)[0]!r}", field=where)
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid:
        raise InvalidInput(
            f"{where}.custom_id must be a non-empty string", field=f"{where}.custom_id"
        )
    check_custom_id(cid, where)
    if obj.get("method") != "POST":
        raise InvalidInput(f"{where}.method must be 'POST'", field=f"{where}.method")
    if obj.get("url") != endpoint:
        raise InvalidInput(
            f"{where}.url is {str(obj.get('url'))[:80]!r}; this batch's endpoint is {endpoint}",
            field=f"{where}.url",
        )
    body = obj.get("body")
    if not isinstance(body, dict):
        raise InvalidInput(f"{where}.body must be a JSON object", field=f"{where}.body")
    allowed = {EMBEDDINGS: _EMBEDDING_KEYS, COMPLETIONS: _COMPLETION_KEYS, INFER: _INFER_KEYS}[
        endpoint
    ]
    extra = set(body) - allowed
    if extra:
        field = f"{where}.body.{sorted(extra)[0]}"
        raise InvalidInput(f"{field}: not a field of {endpoint}", field=field)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidInput(f"{where}.body.model must be a string", field=f"{where}.body.model")
    if endpoint == EMBEDDINGS:
        return _embedding(cid, model, body, where)
    if endpoint == COMPLETIONS:
        return _completion(cid, model, body, where)
    if "input" not in body:
        raise InvalidInput(f"{where}.body.input is required", field=f"{where}.body.input")
    params = body.get("params")
    if params is not None and not isinstance(params, dict):
        raise InvalidInput(f"{where}.body.params must be an object", field=f"{where}.body.params")
    return BatchLine(cid, model, body["input"], params, "")


def _embedding(cid: str, model: str, body: dict[str, Any], where: str) -> BatchLine:
    if "input" not in body:
        raise InvalidInput(f"{where}.body.input is required", field=f"{where}.body.input")
    text = _one_text(body["input"], f"{where}.body.input", "input")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise InvalidInput(
            f"{where}.body.encoding_format must be 'float' or 'base64'",
            field=f"{where}.body.encoding_format",
        )
    if body.get("dimensions") is not None:
        raise InvalidInput(
            f"{where}.body.dimensions is not supported in batches; omit it",
            field=f"{where}.body.dimensions",
        )
    return BatchLine(cid, model, text, None, encoding)


def _completion(cid: str, model: str, body: dict[str, Any], where: str) -> BatchLine:
    if "prompt" not in body:
        raise InvalidInput(f"{where}.body.prompt is required", field=f"{where}.body.prompt")
    prompt = _one_text(body["prompt"], f"{where}.body.prompt", "prompt")
    if body.get("n") not in (None, 1):
        raise InvalidInput(f"{where}.body.n must be 1", field=f"{where}.body.n")
    params = {
        k: body[k] for k in ("max_tokens", "temperature", "seed", "stop") if body.get(k) is not None
    }
    return BatchLine(cid, model, prompt, params, "")


class LineChecks:
    """What must hold across lines: one model, one set of params (a job has one), no
    custom_id twice. Holds only the custom_ids seen (bounded by the item limit)."""

    def __init__(self) -> None:
        self.first: BatchLine | None = None
        self._ids: set[str] = set()

    def check(self, line: BatchLine, n: int) -> None:
        where = f"line {n}"
        if line.custom_id in self._ids:
            raise InvalidInput(
                f"{where}.custom_id {line.custom_id[:80]!r} is used by an earlier line; "
                "custom_id must be unique in a batch",
                field=f"{where}.custom_id",
            )
        self._ids.add(line.custom_id)
        if self.first is None:
            self.first = line
            return
        if line.model != self.first.model:
            raise InvalidInput(
                f"{where}.body.model is {line.model[:80]!r}; every line of a batch must use "
                f"the same model ({self.first.model[:80]!r})",
                field=f"{where}.body.model",
            )
        if line.params != self.first.params or line.encoding != self.first.encoding:
            raise InvalidInput(
                f"{where}: sampling parameters and encoding_format must be the same on every "
                "line of a batch (they are the job's)",
                field=f"{where}.body",
            )


# --- statuses ---------------------------------------------------------------------------

BATCH_STATUSES = (
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
)


def batch_status(job_status: JobStatus, submit_state: str) -> str:
    """OpenAI's status for a job's (core/vocab.py ``JobStatus``). A batch is created
    only once its file is valid, so it is never "failed" here: a job whose items all
    failed is a "completed" batch with an error file, as at OpenAI. "validating" is the
    time its items are being made durable in Kafka. The output file is a view of the
    results, never copied, so "finalizing" is not passed through."""
    if job_status in (JobStatus.QUEUED, JobStatus.RUNNING):
        return "validating" if submit_state != "submitted" else "in_progress"
    if job_status == JobStatus.FAILED:
        return "completed"
    return str(job_status)  # completed, cancelling, cancelled, expired: OpenAI's words too


def request_counts(counts: dict[str, int]) -> dict[str, int]:
    """OpenAI's counts: anything finished without success is "failed"."""
    return {
        "total": counts["total"],
        "completed": counts["succeeded"],
        "failed": counts["failed"] + counts["expired"] + counts["cancelled"],
    }


# --- output and error lines -------------------------------------------------------------

_ERROR_STATUS: dict[str, int] = {
    ItemStatus.FAILED: 500,
    ItemStatus.EXPIRED: 408,
    ItemStatus.CANCELLED: 499,
}


def error_line(custom_id: str | None, request_id: str, status: str, error: Any) -> dict[str, Any]:
    """A line of the error file: the item did not succeed."""
    message = error if isinstance(error, str) and error else f"the request {status}"
    code: dict[str, str] = {
        ItemStatus.FAILED: "model_error",
        ItemStatus.EXPIRED: "batch_expired",
        ItemStatus.CANCELLED: "batch_cancelled",
    }
    return {
        "id": "batch_req_" + uuid.UUID(request_id).hex,
        "custom_id": custom_id,
        "response": {
            "status_code": _ERROR_STATUS.get(status, 500),
            "request_id": request_id,
            "body": {
                "error": {
                    "message": message,
                    "type": "server_error",
                    "param": None,
                    "code": code.get(status, status),
                }
            },
        },
        "error": {"code": code.get(status, status), "message": message},
    }


def output_line(custom_id: str | None, request_id: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "batch_req_" + uuid.UUID(request_id).hex,
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": request_id, "body": body},
        "error": None,
    }


def batch_object(
    b: Any,
    job: Any,
    *,
    status: str,
    counts: dict[str, int],
    has_errors: bool,
    eta: int | None = None,
) -> dict[str, Any]:
    """OpenAI's Batch object (timestamps in Unix seconds). ``eta``: the job's
    completion-time quote (ingest/jobs/estimates.py)."""

    def ts(t: datetime | None) -> int | None:
        return int(t.timestamp()) if t else None

    done = status in ("completed", "cancelled", "expired")
    return {
        "id": b.batch_id,
        "object": "batch",
        "endpoint": b.endpoint,
        "errors": None,
        "input_file_id": b.input_file_id,
        "completion_window": b.completion_window,
        "status": status,
        # Readable while the batch runs (a growing file in input order).
        "output_file_id": output_file_id(b.batch_id) if status != "validating" else None,
        "error_file_id": error_file_id(b.batch_id) if has_errors else None,
        "created_at": ts(b.created_at),
        "in_progress_at": ts(
            job.started_at or (job.created_at if status != "validating" else None)
        ),
        "expires_at": ts(job.expires_at),
        "finalizing_at": ts(job.finished_at),
        "completed_at": ts(job.finished_at) if status == "completed" else None,
        "failed_at": None,
        "expired_at": ts(job.finished_at or job.expires_at) if status == "expired" else None,
        "cancelling_at": ts(job.cancelled_at),
        "cancelled_at": ts(job.finished_at) if status == "cancelled" and done else None,
        # Gristmill adds "reused": completed lines answered from the base batch (decision
        # 61), not computed; OpenAI's SDK keeps a field it does not know.
        "request_counts": {**request_counts(counts), "reused": int(job.reused)},
        "metadata": b.metadata,
        "model": job.model,
        # Gristmill adds the quote, kept current as the batch runs (decision 69); null
        # once it is done or while no worker serves its model.
        "estimated_completion_at": eta,
    }
