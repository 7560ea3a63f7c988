"""OpenAI's Batches API, on Gristmill's jobs (decision 35).

A batch is a job: its input file (ingest/openai/files.py) is read chunk by chunk, each
line checked as OpenAI's (ingest/openai/batch_wire.py) and staged as a job item
(decision 26), then the job is recorded and its items put in Kafka as any job's. Its
output and error files are views of the job's results (ingest/openai/files.py).
Errors are in OpenAI's shape (ingest/edge/error_shapes.py).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import APIRouter, Header, Request
from pydantic import BaseModel, ConfigDict

from core.errors import InvalidInput, NotFound
from core.ids import uuid7
from core.limits import shown
from core.models.causal_lm import CausalLMSpec
from core.models.spec import ModelSpec
from ingest.acceptance.idempotency import check_key
from ingest.acceptance.state import AppState, get_state
from ingest.edge.auth import Caller
from ingest.edge.bodies import json_object
from ingest.edge.error_shapes import Shape, declared
from ingest.edge.json_response import ORJSONResponse
from ingest.jobs import estimates
from ingest.jobs import quota as job_quota
from ingest.jobs.limits import slot
from ingest.jobs.routes import reader
from ingest.jobs.schemas import JobItem, check_metadata, parse_index, validate
from ingest.jobs.submit import Submission, base_job, check_webhook, item_stager, record_job
from ingest.jobs.upload import ItemStager, LineSplitter
from ingest.openai import batch_wire as bw
from ingest.openai.wire import list_page
from results import files as files_db
from results import jobs as jobs_db
from results.jobs import counts, job_status
from results.tenants import Tenant

router = APIRouter()
ERRORS = declared(Shape.OPENAI)

MAX_BATCHES_PAGE = 100  # OpenAI's own bound on GET /v1/batches?limit


class BatchBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    output_expires_after: dict[str, Any] | None = None
    # Gristmill's extension (the OpenAI SDK's ``extra_body``): where to send the batch's
    # terminal event, OpenAI's ``batch.*`` body signed by Standard Webhooks (decision 53).
    webhook_url: str | None = None
    # Gristmill's extension: an incremental batch (decision 61) names an earlier batch of
    # the tenant, same model and version; lines with unchanged content reuse its results.
    base_batch_id: str | None = None


class BatchStager:
    """Lines of an input file -> checked OpenAI lines -> staged job items. The model
    (so the stager) is known from the first line. Synchronous: run it off the loop."""

    def __init__(self, endpoint: str, max_line: int):
        self.endpoint = endpoint
        self.splitter = LineSplitter(max_line)
        self.checks = bw.LineChecks()
        self.items: ItemStager | None = None
        self.spec: ModelSpec | None = None

    def lines(self, chunk: bytes) -> list[tuple[bw.BatchLine, int]]:
        first = self.splitter.lines + 1
        return [
            p
            for n, raw in enumerate(self.splitter.feed(chunk), start=first)
            if (p := _parse(raw, n, self.endpoint))
        ]

    def last(self) -> list[tuple[bw.BatchLine, int]]:
        raw = self.splitter.finish()
        if raw is None:
            return []
        p = _parse(raw, self.splitter.lines, self.endpoint)
        return [p] if p else []

    def stage(self, parsed: list[tuple[bw.BatchLine, int]]) -> None:
        assert self.items is not None and self.spec is not None
        for line, n in parsed:
            self.checks.check(line, n)
            if isinstance(self.spec, CausalLMSpec):
                self._fits(self.spec, line, n)
            self.items.add(JobItem(custom_id=line.custom_id, input=line.input), f"line {n}")

    @staticmethod
    def _fits(spec: CausalLMSpec, line: bw.BatchLine, n: int) -> None:
        """The prompt tokenizes, the sampling parameters are valid, and both fit the
        context: refused naming the line, as the model's own checks name the field."""
        ids = spec.encode_prompt(line.input, field=f"line {n}.body.prompt")
        try:
            params = spec.normalize_params(line.params)
            spec.check_fits(len(ids), params["max_tokens"])
        except InvalidInput as exc:
            field = f"line {n}.body.{(exc.field or 'max_tokens').removeprefix('params.')}"
            raise InvalidInput(f"line {n}: {exc.message}", field=field) from exc


def _parse(raw: bytes, n: int, endpoint: str) -> tuple[bw.BatchLine, int] | None:
    if not raw.strip():
        return None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"line {n}: not valid JSON ({exc})", field=f"line {n}") from exc
    return bw.parse_line(obj, n, endpoint), n


def _check_endpoint(spec: ModelSpec, endpoint: str) -> None:
    if endpoint == bw.EMBEDDINGS and spec.embedding_dim() is None:
        raise InvalidInput(
            f"model {spec.ref} does not answer with embeddings; see GET /v1/models",
            field="line 1.body.model",
        )
    if endpoint == bw.COMPLETIONS and not isinstance(spec, CausalLMSpec):
        raise InvalidInput(f"model {spec.ref} does not generate text", field="line 1.body.model")


async def _stage_file(
    st: AppState, tenant: Tenant, file_id: str, endpoint: str, job_id: str
) -> tuple[BatchStager, ItemStager]:
    s = st.settings
    bs = BatchStager(endpoint, s.max_body_bytes)
    try:
        async for chunk in files_db.file_chunks(st.engine, file_id):
            parsed = await asyncio.to_thread(bs.lines, chunk)
            await _stage(st, tenant, bs, parsed, job_id)
        await _stage(st, tenant, bs, await asyncio.to_thread(bs.last), job_id)
        if bs.items is None:
            raise InvalidInput("the input file holds no request lines", field="input_file_id")
        return bs, bs.items
    except BaseException:
        if bs.items is not None:
            bs.items.close()
        raise


async def _stage(
    st: AppState,
    tenant: Tenant,
    bs: BatchStager,
    parsed: list[tuple[bw.BatchLine, int]],
    job_id: str,
) -> None:
    if not parsed:
        return
    if bs.items is None:
        first = parsed[0][0]
        spec = await st.catalog.resolve(first.model)
        _check_endpoint(spec, bs.endpoint)
        # Every line has the first's params (bw.LineChecks): the job's, in each hash.
        params = spec.normalize_params(first.params)
        bs.spec, bs.items = spec, item_stager(st, tenant, spec, params, job_id)
    await asyncio.to_thread(bs.stage, parsed)


@router.post("/v1/batches", responses=ERRORS, summary="Run a file of requests as a job")
async def create_batch(
    request: Request,
    tenant: Caller,
    idempotency_key: str | None = Header(default=None),
) -> ORJSONResponse:
    st = get_state(request)
    key = check_key(st.settings, idempotency_key)
    body = validate(json_object(await request.body()), BatchBody)
    if body.endpoint not in bw.ENDPOINTS:
        raise InvalidInput(
            f"endpoint must be one of {list(bw.ENDPOINTS)}, got {body.endpoint[:80]!r}",
            field="endpoint",
        )
    window_s = bw.completion_window_s(body.completion_window, st.settings.max_completion_window_s)
    check_metadata(body.metadata)
    if body.webhook_url is not None:
        await check_webhook(st.settings, body.webhook_url)
    now = datetime.now(UTC)
    out_expiry = bw.output_expiry(body.output_expires_after, now)
    f = await files_db.get_file(st.engine, tenant.id, body.input_file_id)
    if f is None:
        raise NotFound(f"no file {body.input_file_id[:80]!r}", field="input_file_id")
    if f.purpose != "batch":
        raise InvalidInput(
            f"file {f.file_id} has purpose {f.purpose!r}; a batch's input needs 'batch'",
            field="input_file_id",
        )
    if body.base_batch_id is not None:
        bw.job_id_for(body.base_batch_id)  # 404 unless it looks like one of ours, early
    await job_quota.refuse_if_in_debt(st.engine, st.settings, tenant)
    job_id = uuid7()  # its items' ids follow its time (decision 72)
    async with slot(st.uploads, tenant.id, "uploads"):
        bs, items = await _stage_file(st, tenant, f.file_id, body.endpoint, job_id)
        try:
            assert bs.spec is not None and bs.checks.first is not None
            first = bs.checks.first
            base = None
            if body.base_batch_id is not None:  # its model is known from the first line
                base_id = bw.job_id_for(body.base_batch_id)
                base = await base_job(st, tenant, base_id, bs.spec, "base_batch_id")
            items.hasher.update(
                orjson.dumps(
                    [
                        f.file_id,
                        body.endpoint,
                        body.completion_window,
                        body.metadata,
                        *([body.webhook_url] if body.webhook_url is not None else []),
                        *([body.base_batch_id] if body.base_batch_id is not None else []),
                    ]
                )
            )
            staged = await asyncio.to_thread(items.finish)
            sub = Submission(
                tenant,
                bs.spec,
                bs.spec.normalize_params(first.params),
                window_s,
                body.webhook_url,
                body.metadata,
                key,
                staged,
                job_id,
                base,
            )
            await estimates.check_window(st, sub, datetime.now(UTC))
            recorded = await record_job(st, sub)
        finally:
            items.close()
        batch_id = bw.batch_id_for(recorded.job_id)
        if recorded.created:
            # After the job's own transaction: a crash between the two leaves the items
            # a plain job (GET /v1/jobs), never lost; decision 35.
            async with st.engine.begin() as conn:
                await files_db.insert_batch(
                    conn,
                    {
                        "batch_id": batch_id,
                        "tenant_id": tenant.id,
                        "job_id": recorded.job_id,
                        "endpoint": body.endpoint,
                        "input_file_id": f.file_id,
                        "completion_window": body.completion_window,
                        "metadata": body.metadata,
                        "item_params": {"encoding_format": first.encoding}
                        if first.encoding
                        else None,
                        "output_expires_at": out_expiry,
                    },
                )
            await st.jobs.publish(recorded.job_id)
    view = await _batch_view(st, tenant, batch_id)
    if recorded.webhook_secret:  # once, as for a job (a replay of the key has none)
        view["webhook_secret"] = recorded.webhook_secret
    return ORJSONResponse(view)


async def _batch_view(st: AppState, tenant: Tenant, batch_id: str) -> dict[str, Any]:
    bw.job_id_for(batch_id)  # 404 unless it looks like one of ours
    b = await files_db.get_batch(st.engine, tenant.id, batch_id)
    if b is None:
        raise NotFound(f"no batch {batch_id[:80]!r}")
    j = await jobs_db.get_job(st.engine, tenant.id, str(b.job_id))
    if j is None:
        raise NotFound(f"no batch {batch_id[:80]!r}")
    return _object(b, j, await estimates.job_estimate(st, j, tenant.weight))


def _object(b: Any, j: Any, eta: int | None) -> dict[str, Any]:
    c = counts(j)
    status = bw.batch_status(job_status(j, datetime.now(UTC)), j.submit_state)
    failed = c["failed"] + c["expired"] + c["cancelled"]
    return bw.batch_object(b, j, status=status, counts=c, has_errors=failed > 0, eta=eta)


@router.get("/v1/batches/{batch_id}", responses=ERRORS)
async def get_batch(request: Request, batch_id: str, tenant: Caller) -> ORJSONResponse:
    st = reader(request, tenant)
    return ORJSONResponse(await _batch_view(st, tenant, batch_id))


@router.post("/v1/batches/{batch_id}/cancel", responses=ERRORS)
async def cancel_batch(request: Request, batch_id: str, tenant: Caller) -> ORJSONResponse:
    """Items not yet started are cancelled; finished ones stay in the output file."""
    st = reader(request, tenant)
    view = await _batch_view(st, tenant, batch_id)
    if view["status"] in ("validating", "in_progress"):
        await jobs_db.cancel_job(st.engine, bw.job_id_for(batch_id), datetime.now(UTC))
        view = await _batch_view(st, tenant, batch_id)
    return ORJSONResponse(view)


@router.get("/v1/batches", responses=ERRORS)
async def list_batches(
    request: Request, tenant: Caller, after: str | None = None, limit: str | None = None
) -> ORJSONResponse:
    """The tenant's batches, newest first (query parameters: ``after``, ``limit``)."""
    st = reader(request, tenant)
    n = parse_index(limit, "limit", default=20, low=1, high=MAX_BATCHES_PAGE)
    rows = await files_db.batch_page(st.engine, tenant.id, after, n + 1)
    if rows is None:
        raise NotFound(f"no batch {shown(after)} to page after", field="after")
    etas = await estimates.job_estimates(
        st, [j for _, j in rows[:n]], tenant.weight, datetime.now(UTC)
    )
    data = [_object(b, j, etas[str(j.job_id)]) for b, j in rows[:n]]
    return ORJSONResponse(list_page(data, more=len(rows) > n))
