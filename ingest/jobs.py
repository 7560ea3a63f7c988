"""The job API: submit many items, poll status and per-item results in input order."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import ORJSONResponse, StreamingResponse
from sqlalchemy import bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from core.errors import InvalidInput, NotFound, PayloadTooLarge, SchemaViolation
from core.messages import job_item_request_id
from ingest import metrics
from ingest.idempotency import MAX_KEY_LENGTH
from ingest.job_submit import JobRequest, body_hasher, jsonl_items, parse_item, record_job
from ingest.policy import charge_job_items, check_job_items
from ingest.state import AppState, get_state
from results.jobs import counts, item_status, items_stmt, job_status
from results.schema import job_items, jobs, requests
from results.tenants import Tenant
from results.vectors import EncodingFormat, answer_output

router = APIRouter()

JSONL_TYPES = {
    "application/x-ndjson",
    "application/jsonl",
    "application/x-jsonlines",
    "application/jsonlines",
}
FIRST_PAGE = 100
MAX_PAGE = 1000


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t else None


def _parse_uuid(job_id: str) -> str:
    try:
        return str(uuid.UUID(job_id))
    except ValueError as exc:
        raise NotFound(f"no job {job_id}") from exc


async def load_job(engine: AsyncEngine, tenant_id: str, job_id: str) -> Any:
    """The job row, only if it belongs to the tenant (another tenant's job is a 404)."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                select(jobs).where(
                    jobs.c.job_id == _parse_uuid(job_id), jobs.c.tenant_id == tenant_id
                )
            )
        ).first()
    if row is None:
        raise NotFound(f"no job {job_id}")
    return row


async def tenant_job(
    request: Request, authorization: str | None, job_id: str
) -> tuple[AppState, Tenant, Any]:
    """The caller's state, tenant and job (authenticated; another tenant's job is a 404)."""
    st = get_state(request)
    tenant = await st.auth.authenticate(authorization)
    return st, tenant, await load_job(st.engine, tenant.id, job_id)


def job_summary(j: Any) -> dict[str, Any]:
    now = datetime.now(UTC)
    c = counts(j)
    return {
        "job_id": str(j.job_id),
        "status": job_status(j, now),
        "model": j.model,
        "model_version": j.model_version,
        "params": j.params,
        "metadata": j.metadata,
        "counts": c,
        "progress": round((c["total"] - c["queued"]) / c["total"], 4) if c["total"] else 1.0,
        "created_at": _iso(j.created_at),
        "started_at": _iso(j.started_at),
        "finished_at": _iso(j.finished_at),
        "cancelled_at": _iso(j.cancelled_at),
        "expires_at": _iso(j.expires_at),
        "attempt": j.attempt,
        "webhook": None
        if not j.webhook_url
        else {
            "url": j.webhook_url,
            "delivered_at": _iso(j.webhook_delivered_at),
            "attempts": j.webhook_attempts,
            "error": j.webhook_error,
        },
    }


def item_view(r: Any, j: Any, now: datetime) -> dict[str, Any]:
    status = item_status(r.status, j, now)
    return {
        "index": r.item_index,
        "custom_id": r.custom_id,
        "status": status,
        "output": answer_output(r.output, r.output_vector, EncodingFormat.FLOAT)
        if status == "succeeded"
        else None,
        "error": r.error,
        "attempts": r.attempts or 0,
    }


async def fetch_items(engine: AsyncEngine, j: Any, start: int, limit: int) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    async with engine.connect() as conn:
        rows = (await conn.execute(items_stmt(str(j.job_id), start, limit))).all()
    return [item_view(r, j, now) for r in rows]


async def _json_body(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(
                f"a JSON job body may be at most {limit} bytes; "
                "upload large jobs as JSONL (application/x-ndjson)"
            )
        chunks.append(chunk)
    return b"".join(chunks)


@router.post("/v1/jobs", status_code=202)
async def submit_job(
    request: Request,
    authorization: str | None = Header(default=None),
    idempotency_key: str | None = Header(default=None),
    model: str | None = Query(default=None, description="JSONL uploads: the model"),
    params: str | None = Query(default=None, description="JSONL uploads: params as JSON"),
    completion_window_s: int | None = Query(default=None),
    webhook_url: str | None = Query(default=None),
) -> ORJSONResponse:
    st: AppState = get_state(request)
    tenant = await st.auth.authenticate(authorization)
    settings = st.settings
    limit_headers = check_job_items(st.limiter, settings, tenant)
    if idempotency_key is not None and not 0 < len(idempotency_key) <= MAX_KEY_LENGTH:
        raise InvalidInput(
            f"Idempotency-Key must be 1..{MAX_KEY_LENGTH} characters", field="Idempotency-Key"
        )
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip()
    hasher = body_hasher()
    metadata: dict[str, Any] | None = None
    if ctype in JSONL_TYPES:
        if not model:
            raise SchemaViolation(
                "JSONL uploads name the model in the query: ?model=...", field="model"
            )
        try:
            raw_params = orjson.loads(params) if params else None
        except orjson.JSONDecodeError as exc:
            raise InvalidInput(
                "query parameter params must be a JSON object", field="params"
            ) from exc
        hasher.update(orjson.dumps([model, raw_params, completion_window_s, webhook_url]))
        spec = await st.catalog.resolve(model)
    elif ctype == "application/json":
        raw = await _json_body(request, settings.max_body_bytes * 256)
        hasher.update(raw)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InvalidInput(f"request body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise InvalidInput("request body must be a JSON object")
        unknown = sorted(
            set(body)
            - {"model", "params", "items", "webhook_url", "metadata", "completion_window_s"}
        )
        if unknown:
            raise SchemaViolation(f"unknown field {unknown[0]!r}", field=unknown[0])
        if not isinstance(body.get("model"), str):
            raise SchemaViolation("field 'model' (a string) is required", field="model")
        if not isinstance(body.get("items"), list):
            raise SchemaViolation("field 'items' (a list) is required", field="items")
        if len(body["items"]) > settings.max_job_json_items:
            raise PayloadTooLarge(
                f"a JSON job may hold at most {settings.max_job_json_items} "
                "items; upload larger jobs as JSONL"
            )
        metadata = body.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise SchemaViolation("metadata must be an object", field="metadata")
        raw_params = body.get("params")
        completion_window_s = body.get("completion_window_s", completion_window_s)
        webhook_url = body.get("webhook_url", webhook_url)
        spec = await st.catalog.resolve(body["model"])
        # Validate every item before anything is written.
        parsed = [parse_item(obj, f"items[{i}]", spec) for i, obj in enumerate(body["items"])]
    else:
        raise InvalidInput(
            f"unsupported Content-Type {ctype!r}; use application/json or application/x-ndjson",
            field="Content-Type",
        )

    if raw_params is not None and not isinstance(raw_params, dict):
        raise SchemaViolation("params must be an object", field="params")
    norm_params = spec.normalize_params(raw_params)
    window = (
        settings.default_completion_window_s if completion_window_s is None else completion_window_s
    )
    if not isinstance(window, int) or not 0 < window <= settings.max_completion_window_s:
        raise InvalidInput(
            f"completion_window_s must be 1..{settings.max_completion_window_s}",
            field="completion_window_s",
        )
    if webhook_url is not None and (
        not isinstance(webhook_url, str) or not webhook_url.startswith(("http://", "https://"))
    ):
        raise InvalidInput("webhook_url must be an http(s) URL", field="webhook_url")
    job = JobRequest(
        tenant_id=tenant.id,
        spec=spec,
        params=norm_params,
        completion_window_s=window,
        webhook_url=webhook_url,
        metadata=metadata,
        idempotency_key=idempotency_key,
    )

    async def items() -> AsyncIterator[tuple[str | None, Any]]:
        if ctype in JSONL_TYPES:
            async for item in jsonl_items(request.stream(), spec, settings, hasher):
                yield item
        else:
            for item in parsed:
                yield item

    recorded = await record_job(settings, job, items(), lambda: hasher.hexdigest())
    if recorded.created:
        await asyncio.to_thread(st.jobs.publish, recorded.job_id)
        charge_job_items(
            st.limiter,
            settings,
            tenant,
            (await load_job(st.engine, tenant.id, recorded.job_id)).total_items,
        )
    j = await load_job(st.engine, tenant.id, recorded.job_id)
    if recorded.created:
        metrics.job_submitted(tenant.tier, int(j.total_items))
    body_out = job_summary(j)
    if recorded.webhook_secret:
        body_out["webhook_secret"] = recorded.webhook_secret
    return ORJSONResponse(body_out, status_code=202, headers=limit_headers)


@router.get("/v1/jobs")
async def list_jobs(
    request: Request,
    authorization: str | None = Header(default=None),
    limit: int = Query(default=20, ge=1, le=100),
    before: str | None = Query(default=None, description="created_at cursor"),
) -> ORJSONResponse:
    st = get_state(request)
    tenant = await st.auth.authenticate(authorization)
    q = select(jobs).where(jobs.c.tenant_id == tenant.id)
    if before:
        try:
            q = q.where(jobs.c.created_at < datetime.fromisoformat(before))
        except ValueError as exc:
            raise InvalidInput("before must be an ISO timestamp", field="before") from exc
    async with st.engine.connect() as conn:
        rows = (await conn.execute(q.order_by(jobs.c.created_at.desc()).limit(limit))).all()
    out = [job_summary(r) for r in rows]
    return ORJSONResponse(
        {"jobs": out, "next": out[-1]["created_at"] if len(out) == limit else None}
    )


@router.get("/v1/jobs/{job_id}")
async def get_job(
    request: Request, job_id: str, authorization: str | None = Header(default=None)
) -> ORJSONResponse:
    st, _tenant, j = await tenant_job(request, authorization, job_id)
    items = await fetch_items(st.engine, j, 0, FIRST_PAGE)
    return ORJSONResponse(
        {
            **job_summary(j),
            "items": items,
            "next_cursor": FIRST_PAGE if j.total_items > FIRST_PAGE else None,
        }
    )


@router.get("/v1/jobs/{job_id}/items")
async def get_items(
    request: Request,
    job_id: str,
    authorization: str | None = Header(default=None),
    cursor: int = Query(default=0, ge=0),
    limit: int = Query(default=FIRST_PAGE, ge=1, le=MAX_PAGE),
) -> ORJSONResponse:
    st, _tenant, j = await tenant_job(request, authorization, job_id)
    items = await fetch_items(st.engine, j, cursor, limit)
    nxt = cursor + limit
    return ORJSONResponse({"items": items, "next_cursor": nxt if nxt < j.total_items else None})


@router.get("/v1/jobs/{job_id}/results")
async def stream_results(
    request: Request,
    job_id: str,
    authorization: str | None = Header(default=None),
    follow: bool = Query(default=False),
) -> StreamingResponse:
    """NDJSON in input order. Stops at the first unfinished item, or waits for it
    with ``follow=true`` until the job is finished."""
    st, tenant, j = await tenant_job(request, authorization, job_id)

    async def lines() -> AsyncIterator[bytes]:
        job = j
        pos = 0
        while pos < job.total_items:
            page = await fetch_items(st.engine, job, pos, MAX_PAGE)
            ready = []
            for it in page:
                if it["status"] == "queued":
                    break
                ready.append(it)
            if ready:
                yield b"".join(orjson.dumps(it) + b"\n" for it in ready)
                pos += len(ready)
                continue
            if not follow or await request.is_disconnected():
                return
            await asyncio.sleep(0.5)
            job = await load_job(st.engine, tenant.id, job_id)

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@router.post("/v1/jobs/{job_id}/cancel")
async def cancel_job(
    request: Request, job_id: str, authorization: str | None = Header(default=None)
) -> ORJSONResponse:
    """Items not yet started are cancelled at once; finished results stay readable."""
    st, tenant, j = await tenant_job(request, authorization, job_id)
    if j.finished_at is None and j.cancelled_at is None:
        async with st.engine.begin() as conn:
            await conn.execute(
                update(jobs)
                .where(jobs.c.job_id == j.job_id, jobs.c.cancelled_at.is_(None))
                .values(cancelled_at=datetime.now(UTC))
            )
        j = await load_job(st.engine, tenant.id, job_id)
    return ORJSONResponse(job_summary(j), status_code=202)


@router.post("/v1/jobs/{job_id}/retry")
async def retry_job(
    request: Request, job_id: str, authorization: str | None = Header(default=None)
) -> ORJSONResponse:
    """Run the failed, cancelled or expired items of a finished job again, as a new attempt."""
    st, tenant, j = await tenant_job(request, authorization, job_id)
    now = datetime.now(UTC)
    if job_status(j, now) not in ("completed", "failed", "cancelled", "expired"):
        raise InvalidInput(
            f"job is {job_status(j, now)}; only a finished job can be retried", field="status"
        )
    attempt = j.attempt + 1
    async with st.engine.begin() as conn:
        # Items whose current attempt did not succeed (or never ran) get a new request id.
        redo = (
            select(job_items.c.item_index)
            .select_from(
                job_items.outerjoin(requests, requests.c.request_id == job_items.c.request_id)
            )
            .where(job_items.c.job_id == j.job_id)
            .where((requests.c.status.is_(None)) | (requests.c.status != "succeeded"))
        )
        indexes = [r[0] for r in (await conn.execute(redo)).all()]
        if not indexes:
            raise InvalidInput("every item already succeeded; nothing to retry", field="items")
        # A new attempt gets new request ids, so its results are new rows (the old
        # attempt's rows stay in the request log).
        await conn.execute(
            update(job_items)
            .where(job_items.c.job_id == bindparam("j"), job_items.c.item_index == bindparam("i"))
            .values(attempt=attempt, request_id=bindparam("rid")),
            [
                {"j": str(j.job_id), "i": i, "rid": job_item_request_id(str(j.job_id), i, attempt)}
                for i in indexes
            ],
        )
        window = j.expires_at - j.created_at
        await conn.execute(
            update(jobs)
            .where(jobs.c.job_id == j.job_id)
            .values(
                attempt=attempt,
                failed=0,
                expired=0,
                cancelled=0,
                finished_at=None,
                cancelled_at=None,
                expires_at=now + window,
                submit_state="submitting",
                webhook_delivered_at=None,
                webhook_attempts=0,
                webhook_next_at=None,
                webhook_error=None,
            )
        )
    await asyncio.to_thread(st.jobs.publish, str(j.job_id))
    return ORJSONResponse(
        job_summary(await load_job(st.engine, tenant.id, job_id)), status_code=202
    )
