"""The job API: submit many items, poll status and per-item results in input order."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from core.errors import InvalidInput, NotFound, PayloadTooLarge
from core.limits import ascii_decimal, canonical_uuid, shown
from core.messages import job_item_request_ids
from core.vocab import ItemStatus
from ingest import metrics
from ingest.acceptance.deferred import completion_headers
from ingest.acceptance.idempotency import check_key
from ingest.acceptance.prefer import parse_prefer
from ingest.acceptance.state import AppState, get_state
from ingest.edge.auth import Caller
from ingest.edge.json_response import ORJSONResponse
from ingest.jobs import estimates
from ingest.jobs import quota as job_quota
from ingest.jobs.limits import HeldStream, acquire, check_reads, hold_stream, slot
from ingest.jobs.schemas import MAX_INDEX, JobOptions, parse_index, validate
from ingest.jobs.submit import Submission, record_job, stage_json, stage_jsonl
from ingest.jobs.views import item_view, job_summary
from results import job_items as items_db
from results import jobs as jobs_db
from results.reembed import job_migration
from results.tenants import Tenant

router = APIRouter()

JSONL_TYPES = {
    "application/x-ndjson",
    "application/jsonl",
    "application/x-jsonlines",
    "application/jsonlines",
}
FIRST_PAGE = 100
MAX_PAGE = 1000
MAX_LIST = 100
FOLLOW_POLL_S = 0.5  # how often a follow=true stream looks for newly finished items


def canonical_id(raw: str) -> str:
    """A job id in canonical form; anything else is a job nobody has (ids are matched
    strictly: core/limits.py)."""
    canonical = canonical_uuid(raw)
    if canonical is None:
        raise NotFound(f"no job {shown(raw)}; ids are canonical UUIDs")
    return canonical


async def own_job(st: AppState, tenant: Tenant, raw_id: str) -> Any:
    """The tenant's job; another tenant's job is a 404 like one that does not exist."""
    jid = canonical_id(raw_id)
    j = await jobs_db.get_job(st.engine, tenant.id, jid)
    if j is None:
        raise NotFound(f"no job {jid}")
    return j


def reader(request: Request, tenant: Tenant) -> AppState:
    """The state, once the read is within the tenant's read rate."""
    st = get_state(request)
    check_reads(st.limiter, st.settings, tenant)
    return st


async def page(st: AppState, j: Any, start: int, limit: int) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    rows = await items_db.items_page(st.engine, str(j.job_id), start, limit)
    return [item_view(r, j, now) for r in rows]


def jsonl_options(
    model: str | None,
    params: str | None,
    window: int | None,
    webhook_url: str | None,
    base_job_id: str | None = None,
) -> JobOptions:
    """A JSONL upload's options come in the query string."""
    try:
        parsed = orjson.loads(params) if params else None
    except orjson.JSONDecodeError as exc:
        raise InvalidInput("query parameter params must be a JSON object", field="params") from exc
    data = {"model": model, "params": parsed, "completion_window_s": window}
    if model is None:
        data.pop("model")
    return validate({**data, "webhook_url": webhook_url, "base_job_id": base_job_id}, JobOptions)


@router.post("/v1/jobs", status_code=202)
async def submit_job(
    request: Request,
    tenant: Caller,
    idempotency_key: str | None = Header(default=None),
    model: str | None = Query(default=None, description="JSONL uploads: the model"),
    params: str | None = Query(default=None, description="JSONL uploads: params as JSON"),
    completion_window_s: int | None = Query(default=None),
    webhook_url: str | None = Query(default=None),
    base_job_id: str | None = Query(default=None, description="JSONL uploads: the base job"),
    dry_run: bool = Query(default=False, description="validate, count and quote; record nothing"),
) -> ORJSONResponse:
    st = get_state(request)
    key = check_key(st.settings, idempotency_key)
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip()
    if ctype != "application/json" and ctype not in JSONL_TYPES:
        raise InvalidInput(
            f"unsupported Content-Type {ctype!r}; use application/json or application/x-ndjson",
            field="Content-Type",
        )
    json_body = ctype == "application/json"
    cap = st.settings.max_job_json_bytes if json_body else st.settings.max_job_bytes
    declared = request.headers.get("content-length", "")
    if (ascii_decimal(declared) or 0) > cap:
        raise PayloadTooLarge(
            f"a JSON job body may be at most {cap} bytes; upload large jobs as JSONL"
            if json_body
            else f"a job upload may be at most {cap} bytes"
        )
    await job_quota.refuse_if_in_debt(st.engine, st.settings, tenant)  # before reading a byte
    async with slot(st.uploads, tenant.id, "uploads"):
        t0 = time.monotonic()
        if json_body:
            sub = await stage_json(st, tenant, request.stream(), key)
        else:
            opts = jsonl_options(model, params, completion_window_s, webhook_url, base_job_id)
            sub = await stage_jsonl(st, tenant, request.stream(), opts, key)
        t1 = time.monotonic()
        try:
            if dry_run:
                return ORJSONResponse(await quote_view(st, sub))
            # Prefer: partial-results takes what the window allows: not refused, its
            # unfinished items expire at the window's end (decision 69).
            if not parse_prefer(request.headers.getlist("prefer")).partial:
                await estimates.check_window(st, sub, datetime.now(UTC))
            recorded = await record_job(st, sub)
            t2 = time.monotonic()
            if recorded.created:  # its items are read back from the staged file
                await st.jobs.publish(recorded.job_id, sub.staged)
                metrics.job_phase("stage", t1 - t0)
                metrics.job_phase("record", t2 - t1)
                metrics.job_phase("publish", time.monotonic() - t2)
        finally:
            sub.staged.close()
    j = await own_job(st, tenant, recorded.job_id)
    if recorded.created:
        metrics.job_submitted(tenant.tier, int(j.total_items))
    eta = await estimates.job_estimate(st, j, tenant.weight)
    body = job_summary(j, datetime.now(UTC), eta)
    if recorded.webhook_secret:
        body["webhook_secret"] = recorded.webhook_secret
    return ORJSONResponse(body, status_code=202, headers=completion_headers(eta))


async def quote_view(st: AppState, sub: Submission) -> dict[str, Any]:
    """A dry run's answer: the job as it would be submitted, counted and quoted."""
    now = datetime.now(UTC)
    quote = await estimates.new_job_quote(st, sub.tenant, sub.spec, sub.staged.count, now)
    return {
        "object": "job.quote",
        "dry_run": True,
        "model": sub.spec.name,
        "model_version": sub.spec.version,
        "total_items": sub.staged.count,
        "completion_window_s": sub.window_s,
        "estimated_completion_at": quote,
        # None: no worker serves the model yet, so there is no quote to hold it to.
        "meets_window": None if quote is None else quote <= now.timestamp() + sub.window_s,
    }


@router.get("/v1/jobs")
async def list_jobs(
    request: Request,
    tenant: Caller,
    limit: str | None = Query(default=None),
    before: str | None = Query(default=None, description="created_at cursor"),
) -> ORJSONResponse:
    st = reader(request, tenant)
    n = parse_index(limit, "limit", default=20, low=1, high=MAX_LIST)
    cutoff = None
    if before is not None:
        try:
            cutoff = datetime.fromisoformat(before)
        except ValueError as exc:
            raise InvalidInput("before must be an ISO 8601 timestamp", field="before") from exc
        if cutoff.tzinfo is None:
            cutoff = cutoff.replace(tzinfo=UTC)
    now = datetime.now(UTC)
    rows = await jobs_db.list_jobs(st.engine, tenant.id, cutoff, n)
    etas = await estimates.job_estimates(st, rows, tenant.weight, now)
    out = [job_summary(r, now, etas[str(r.job_id)]) for r in rows]
    return ORJSONResponse({"jobs": out, "next": out[-1]["created_at"] if len(out) == n else None})


@router.get("/v1/jobs/{job_id}")
async def get_job(request: Request, job_id: str, tenant: Caller) -> ORJSONResponse:
    st = reader(request, tenant)
    j = await own_job(st, tenant, job_id)
    items = await page(st, j, 0, FIRST_PAGE)
    eta = await estimates.job_estimate(st, j, tenant.weight)
    migration = await job_migration(st.engine, str(j.job_id))  # a re-embed: its coverage
    return ORJSONResponse(
        {
            **job_summary(j, datetime.now(UTC), eta),
            "migration": None if migration is None else migration.view(),
            "items": items,
            "next_cursor": FIRST_PAGE if j.total_items > FIRST_PAGE else None,
        }
    )


@router.get("/v1/jobs/{job_id}/items")
async def get_items(
    request: Request,
    job_id: str,
    tenant: Caller,
    cursor: str | None = Query(default=None, description="index of the first item"),
    limit: str | None = Query(default=None, description=f"items per page, 1..{MAX_PAGE}"),
) -> ORJSONResponse:
    st = reader(request, tenant)
    start = parse_index(cursor, "cursor", default=0, low=0, high=MAX_INDEX)
    n = parse_index(limit, "limit", default=FIRST_PAGE, low=1, high=MAX_PAGE)
    j = await own_job(st, tenant, job_id)
    items = await page(st, j, start, n)
    nxt = start + n
    return ORJSONResponse({"items": items, "next_cursor": nxt if nxt < j.total_items else None})


@router.get("/v1/jobs/{job_id}/results")
async def stream_results(
    request: Request,
    job_id: str,
    tenant: Caller,
    follow: bool = Query(default=False),
) -> StreamingResponse:
    """NDJSON in input order. Stops at the first unfinished item, or waits for it
    with ``follow=true`` until the job is finished."""
    st = reader(request, tenant)
    j = await own_job(st, tenant, job_id)

    async def lines() -> AsyncIterator[bytes]:
        job, pos = j, 0
        while pos < job.total_items:
            ready = []
            for it in await page(st, job, pos, MAX_PAGE):
                if it["status"] == ItemStatus.QUEUED:
                    break
                ready.append(it)
            if ready:
                yield b"".join(orjson.dumps(it) + b"\n" for it in ready)
                pos += len(ready)
                continue
            if not follow or await request.is_disconnected():
                return
            await asyncio.sleep(FOLLOW_POLL_S)
            job = await own_job(st, tenant, job_id)

    if not follow:
        return HeldStream(lines(), hold_stream(st, tenant))
    # A follow stream is open as long as the job runs: bounded per tenant and instance.
    acquire(st.follows, tenant.id, "follow=true streams")
    return HeldStream(lines(), lambda: st.follows.release(tenant.id))


@router.post("/v1/jobs/{job_id}/cancel")
async def cancel_job(request: Request, job_id: str, tenant: Caller) -> ORJSONResponse:
    """Items not yet started are cancelled at once; finished results stay readable."""
    st = reader(request, tenant)
    j = await own_job(st, tenant, job_id)
    if j.finished_at is None and j.cancelled_at is None:
        await jobs_db.cancel_job(st.engine, str(j.job_id), datetime.now(UTC))
        j = await own_job(st, tenant, job_id)
    return ORJSONResponse(job_summary(j, datetime.now(UTC)), status_code=202)


@router.post("/v1/jobs/{job_id}/retry")
async def retry_job(request: Request, job_id: str, tenant: Caller) -> ORJSONResponse:
    """Run the failed, cancelled or expired items of a finished job again, as a new
    attempt, charged to the tenant's job-item budget like a new job."""
    st = get_state(request)
    jid = canonical_id(job_id)
    now = datetime.now(UTC)
    async with st.engine.begin() as conn:
        # Locked: a settle of the job's results waits for the new attempt; results of the
        # old attempt count toward it alone (results/jobs.py, _COUNT).
        j = await jobs_db.lock_job(conn, tenant.id, jid)
        if j is None:
            raise NotFound(f"no job {jid}")
        status = jobs_db.job_status(j, now)
        if not status.finished:
            raise InvalidInput(
                f"job is {status}; only a finished job can be retried", field="status"
            )
        redo = await jobs_db.unsucceeded_items(conn, jid)
        if not redo:
            raise InvalidInput("every item already succeeded; nothing to retry", field="items")
        await job_quota.charge(conn, st.settings, tenant, len(redo))
        attempt = j.attempt + 1
        rid = job_item_request_ids(jid, attempt)
        await items_db.give_new_request_ids(conn, jid, attempt, redo, [rid(i) for i in redo])
        await jobs_db.start_attempt(conn, j, attempt, now, succeeded=j.total_items - len(redo))
    await st.jobs.publish(jid)
    j = await own_job(st, tenant, jid)
    eta = await estimates.job_estimate(st, j, tenant.weight)
    return ORJSONResponse(
        job_summary(j, datetime.now(UTC), eta),
        status_code=202,
        headers=completion_headers(eta),
    )
