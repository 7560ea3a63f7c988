"""OpenAI's Files and Batches APIs, on Gristmill's jobs (decision 35).

A file is stored in PostgreSQL in chunks (results/files.py); an upload is spooled to
a temp file as it arrives (bounded memory) and stored in one transaction. A batch is
a job: its input file is read chunk by chunk, each line checked as OpenAI's
(ingest/batch_wire.py) and staged as a job item (decision 26), then the job is
recorded and its items put in Kafka as any job's. Its output and error files are
views of the job's results, streamed in input order and readable while it runs.
Errors are in OpenAI's shape (ingest/error_shapes.py).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import ORJSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from core.errors import InvalidInput, NotFound, PayloadTooLarge
from core.limits import ascii_decimal, shown
from core.models.causal_lm import CausalLMSpec
from core.models.spec import ModelSpec
from ingest import batch_wire as bw
from ingest import file_budget as fb
from ingest import job_quota
from ingest.completions import completion_body
from ingest.error_shapes import Shape, declared
from ingest.idempotency import check_key
from ingest.job_limits import hold_stream, slot
from ingest.job_schemas import JobItem, check_metadata, parse_index, validate
from ingest.job_submit import Submission, _stager, check_webhook, record_job
from ingest.job_upload import ItemStager, LineSplitter, body_chunks
from ingest.jobs import HeldStream, reader
from ingest.openai_wire import EncodingFormat, embeddings_answer, prompt_tokens
from ingest.schemas import json_object
from ingest.state import AppState, get_state
from results import files as files_db
from results import jobs as jobs_db
from results.jobs import counts, item_status, job_status
from results.tenants import Tenant

router = APIRouter()
ERRORS = declared(Shape.OPENAI)

PURPOSES = ("batch",)  # the one purpose these files serve
MAX_FILES_PAGE = 10_000  # OpenAI's own bound on GET /v1/files?limit
MAX_BATCHES_PAGE = 100  # OpenAI's own bound on GET /v1/batches?limit
RESULT_PAGE = 1_000  # result rows read per query while streaming an output file
_MAX_FILENAME = 255


def _ts(t: datetime | None) -> int | None:
    return int(t.timestamp()) if t else None


def file_object(f: Any) -> dict[str, Any]:
    return {
        "id": f.file_id,
        "object": "file",
        "bytes": int(f.bytes),
        "created_at": _ts(f.created_at),
        "expires_at": _ts(f.expires_at),
        "filename": f.filename,
        "purpose": f.purpose,
        "status": "processed",
        "status_details": None,
    }


# --- files ------------------------------------------------------------------------------


async def _capped(request: Request, st: AppState, cap: int) -> AsyncGenerator[bytes, None]:
    s = st.settings
    async for chunk in body_chunks(
        request.stream(),
        idle_timeout_s=s.upload_idle_timeout_s,
        max_bytes=cap,
        what="a file upload",
        min_rate_bps=s.upload_min_bytes_per_s,
    ):
        yield chunk


# The form OpenAI's SDK sends (``expires_after`` as bracketed fields), for the schema.
_FILE_FORM = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "purpose": {"type": "string", "enum": list(PURPOSES)},
                        fb.ANCHOR: {"type": "string", "enum": ["created_at"]},
                        fb.SECONDS: {
                            "type": "integer",
                            "minimum": bw.MIN_OUTPUT_EXPIRY_S,
                            "maximum": bw.MAX_OUTPUT_EXPIRY_S,
                        },
                    },
                }
            }
        },
    }
}


@router.post(
    "/v1/files",
    responses=ERRORS,
    summary="Upload a JSONL file (purpose=batch)",
    openapi_extra=_FILE_FORM,
)
async def create_file(
    request: Request, authorization: str | None = Header(default=None)
) -> ORJSONResponse:
    st = get_state(request)
    tenant = await st.auth.authenticate(authorization)
    ctype = request.headers.get("content-type", "")
    if not ctype.startswith("multipart/form-data"):
        raise InvalidInput("POST /v1/files takes multipart/form-data", field="Content-Type")
    declared = ascii_decimal(request.headers.get("content-length", "")) or 0
    if declared > st.settings.max_job_bytes:
        raise PayloadTooLarge(f"a file may be at most {st.settings.max_job_bytes} bytes")
    # The budget before a byte is read (decision 42): the upload rate, the files kept and
    # the room left (for what the body announces), which also caps what it may spool.
    headers = fb.check_upload_rate(st.limiter, st.settings, tenant, time.monotonic())
    budget = fb.Budget.of(st.settings, tenant.tier)
    used = await files_db.usage(st.engine, tenant.id)
    budget.check(used, max(1, declared - fb.MULTIPART_SLACK))
    cap = min(st.settings.max_job_bytes, budget.room(used) + fb.MULTIPART_SLACK)
    async with slot(st.uploads, tenant.id, "uploads"):
        # The parser spools the file part to disk past 1 MiB: memory stays bounded.
        parser = MultiPartParser(
            request.headers, _capped(request, st, cap), max_files=1, max_fields=8
        )
        try:
            form = await parser.parse()
        except MultiPartException as exc:
            raise InvalidInput(f"the multipart body is malformed: {exc.message}") from exc
        except PayloadTooLarge:
            if cap < st.settings.max_job_bytes:
                budget.check(used, budget.room(used) + 1)  # the quota, not the cap: 403
            raise
        try:
            purpose = form.get("purpose")
            upload = form.get("file")
            if purpose not in PURPOSES:
                raise InvalidInput(
                    f"purpose must be one of {list(PURPOSES)}, got {str(purpose)[:40]!r}",
                    field="purpose",
                )
            if not isinstance(upload, UploadFile):
                raise InvalidInput("the form needs a 'file' part", field="file")
            name = (upload.filename or "upload.jsonl")[:_MAX_FILENAME]
            if "\x00" in name:
                raise InvalidInput("filename must not contain NUL", field="file")
            size = upload.size or 0
            if size == 0:
                raise InvalidInput("the file is empty", field="file")
            s = st.settings
            expires = fb.expiry(
                form.get(fb.ANCHOR),
                form.get(fb.SECONDS),
                datetime.now(UTC),
                s.file_default_expiry_s,
            )
            if purpose == "batch":  # JSONL, or nothing of it is stored
                await asyncio.to_thread(fb.check_jsonl, upload.file, s.max_body_bytes)
            fid = bw.new_file_id()
            await files_db.store_file(
                st.engine,
                file_id=fid,
                tenant_id=tenant.id,
                purpose=purpose,
                filename=name,
                staged=upload.file,
                size=size,
                expires_at=expires,
                admit=lambda now_used: budget.check(now_used, size),
            )
        finally:
            await form.close()
    f = await files_db.get_file(st.engine, tenant.id, fid)
    return ORJSONResponse(file_object(f), headers=headers)


@router.get("/v1/files", responses=ERRORS)
async def list_files(
    request: Request,
    authorization: str | None = Header(default=None),
    purpose: str | None = Query(default=None),
    limit: str | None = Query(default=None),
    after: str | None = Query(default=None),
    order: str = Query(default="desc"),
) -> ORJSONResponse:
    st, tenant = await reader(request, authorization)
    n = parse_index(limit, "limit", default=MAX_FILES_PAGE, low=1, high=MAX_FILES_PAGE)
    if order not in ("asc", "desc"):
        raise InvalidInput("order must be 'asc' or 'desc'", field="order")
    mark = None
    if after is not None:
        mark = await files_db.get_file(st.engine, tenant.id, after)
        if mark is None:
            raise NotFound(f"no file {after[:80]!r} to page after", field="after")
    rows = await files_db.list_files(
        st.engine, tenant.id, purpose=purpose, after=mark, limit=n + 1, newest_first=order == "desc"
    )
    data = [file_object(f) for f in rows[:n]]
    return ORJSONResponse(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": len(rows) > n,
        }
    )


async def _result_file(st: AppState, tenant: Tenant, file_id: str) -> tuple[Any, Any, bool] | None:
    """(batch, job, errors?) when ``file_id`` is one of the tenant's batches' result files."""
    named = bw.result_file(file_id)
    if named is None:
        return None
    batch_id, errors = named
    b = await files_db.get_batch(st.engine, tenant.id, batch_id)
    if b is None:
        raise NotFound(f"no file {file_id[:80]!r}")
    j = await jobs_db.get_job(st.engine, tenant.id, str(b.job_id))
    if j is None:
        raise NotFound(f"no file {file_id[:80]!r}")
    now = datetime.now(UTC)
    if b.output_expires_at is not None and now >= b.output_expires_at:
        raise NotFound(f"file {file_id[:80]!r} expired (output_expires_after)")
    return b, j, errors


async def _uploaded_file(st: AppState, tenant: Tenant, file_id: str) -> Any:
    """The tenant's uploaded file ``file_id``; 404 when it has none of that id."""
    f = await files_db.get_file(st.engine, tenant.id, file_id)
    if f is None:
        raise NotFound(f"no file {file_id[:80]!r}")
    return f


@router.get("/v1/files/{file_id}", responses=ERRORS)
async def get_file(
    request: Request, file_id: str, authorization: str | None = Header(default=None)
) -> ORJSONResponse:
    st, tenant = await reader(request, authorization)
    result = await _result_file(st, tenant, file_id)
    if result is not None:
        b, _j, errors = result
        return ORJSONResponse(
            {
                "id": file_id,
                "object": "file",
                # A growing view of the results: its size is known once it is read.
                "bytes": None,
                "created_at": _ts(b.created_at),
                "expires_at": _ts(b.output_expires_at),
                "filename": f"{b.batch_id}_{'error' if errors else 'output'}.jsonl",
                "purpose": "batch_output",
                "status": "processed",
                "status_details": None,
            }
        )
    return ORJSONResponse(file_object(await _uploaded_file(st, tenant, file_id)))


@router.delete("/v1/files/{file_id}", responses=ERRORS)
async def delete_file(
    request: Request, file_id: str, authorization: str | None = Header(default=None)
) -> ORJSONResponse:
    st, tenant = await reader(request, authorization)
    if bw.result_file(file_id) is not None:
        raise InvalidInput(
            "a batch's output and error files live as long as the batch; they cannot be deleted",
            field="file_id",
        )
    if not await files_db.delete_file(st.engine, tenant.id, file_id):
        raise NotFound(f"no file {file_id[:80]!r}")
    return ORJSONResponse({"id": file_id, "object": "file", "deleted": True})


@router.get("/v1/files/{file_id}/content", responses=ERRORS)
async def file_content(
    request: Request, file_id: str, authorization: str | None = Header(default=None)
) -> StreamingResponse:
    st, tenant = await reader(request, authorization)
    result = await _result_file(st, tenant, file_id)
    if result is not None:
        b, j, errors = result
        lines = result_lines(st, b, j, errors)
    else:
        lines = files_db.file_chunks(st.engine, (await _uploaded_file(st, tenant, file_id)).file_id)
    return HeldStream(lines, hold_stream(st, tenant), media_type="application/jsonl")


def _answer(b: Any, j: Any, r: Any) -> dict[str, Any]:
    """The response body a succeeded item's line carries, as its endpoint answers."""
    rid = str(r.request_id)
    if b.endpoint == bw.EMBEDDINGS:
        encoding = EncodingFormat((b.item_params or {}).get("encoding_format", "float"))
        return embeddings_answer(
            [{"output": r.output, "output_vector": r.output_vector}],
            model=j.model,
            encoding=encoding,
            dimensions=None,
            tokens=prompt_tokens(r.input),
        )
    if b.endpoint == bw.COMPLETIONS:
        return completion_body(rid, _ts(j.created_at) or 0, j.model, r.output)
    return {"request_id": rid, "status": "succeeded", "model": j.model, "output": r.output}


async def result_lines(st: AppState, b: Any, j: Any, errors: bool) -> AsyncIterator[bytes]:
    """The output (or error) lines in input order, a page of rows at a time; stops at
    the first item still running, so a file read mid-batch is a prefix of the final one."""
    pos, now = 0, datetime.now(UTC)
    while pos < j.total_items:
        rows = await files_db.result_page(st.engine, str(j.job_id), pos, RESULT_PAGE)
        out: list[bytes] = []
        for r in rows:
            status = item_status(r.status, j, now)
            if status == "queued":
                if out:
                    yield b"".join(out)
                return
            ok = status == "succeeded"
            if ok != errors:
                line = (
                    bw.error_line(r.custom_id, str(r.request_id), status, r.error)
                    if errors
                    else bw.output_line(r.custom_id, str(r.request_id), _answer(b, j, r))
                )
                out.append(orjson.dumps(line) + b"\n")
        if out:
            yield b"".join(out)
        if not rows:
            return
        pos = rows[-1].item_index + 1


# --- batches ----------------------------------------------------------------------------


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
            await _stage(st, bs, parsed, job_id)
        await _stage(st, bs, await asyncio.to_thread(bs.last), job_id)
        if bs.items is None:
            raise InvalidInput("the input file holds no request lines", field="input_file_id")
        return bs, bs.items
    except BaseException:
        if bs.items is not None:
            bs.items.close()
        raise


async def _stage(
    st: AppState, bs: BatchStager, parsed: list[tuple[bw.BatchLine, int]], job_id: str
) -> None:
    if not parsed:
        return
    if bs.items is None:
        spec = await st.catalog.resolve(parsed[0][0].model)
        _check_endpoint(spec, bs.endpoint)
        bs.spec, bs.items = spec, _stager(st, spec, job_id)
    await asyncio.to_thread(bs.stage, parsed)


@router.post("/v1/batches", responses=ERRORS, summary="Run a file of requests as a job")
async def create_batch(
    request: Request,
    authorization: str | None = Header(default=None),
    idempotency_key: str | None = Header(default=None),
) -> ORJSONResponse:
    st = get_state(request)
    tenant = await st.auth.authenticate(authorization)
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
    await job_quota.refuse_if_in_debt(st.engine, st.settings, tenant)
    job_id = str(uuid.uuid4())
    async with slot(st.uploads, tenant.id, "uploads"):
        bs, items = await _stage_file(st, tenant, f.file_id, body.endpoint, job_id)
        try:
            assert bs.spec is not None and bs.checks.first is not None
            first = bs.checks.first
            items.hasher.update(
                orjson.dumps(
                    [
                        f.file_id,
                        body.endpoint,
                        body.completion_window,
                        body.metadata,
                        *([body.webhook_url] if body.webhook_url is not None else []),
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
            )
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
    return _object(b, j)


def _object(b: Any, j: Any) -> dict[str, Any]:
    c = counts(j)
    status = bw.batch_status(job_status(j, datetime.now(UTC)), j.submit_state)
    failed = c["failed"] + c["expired"] + c["cancelled"]
    return bw.batch_object(b, j, status=status, counts=c, has_errors=failed > 0)


@router.get("/v1/batches/{batch_id}", responses=ERRORS)
async def get_batch(
    request: Request, batch_id: str, authorization: str | None = Header(default=None)
) -> ORJSONResponse:
    st, tenant = await reader(request, authorization)
    return ORJSONResponse(await _batch_view(st, tenant, batch_id))


@router.post("/v1/batches/{batch_id}/cancel", responses=ERRORS)
async def cancel_batch(
    request: Request, batch_id: str, authorization: str | None = Header(default=None)
) -> ORJSONResponse:
    """Items not yet started are cancelled; finished ones stay in the output file."""
    st, tenant = await reader(request, authorization)
    view = await _batch_view(st, tenant, batch_id)
    if view["status"] in ("validating", "in_progress"):
        await jobs_db.cancel_job(st.engine, bw.job_id_for(batch_id), datetime.now(UTC))
        view = await _batch_view(st, tenant, batch_id)
    return ORJSONResponse(view)


@router.get("/v1/batches", responses=ERRORS)
async def list_batches(
    request: Request,
    authorization: str | None = Header(default=None),
    after: str | None = Query(default=None),
    limit: str | None = Query(default=None),
) -> ORJSONResponse:
    st, tenant = await reader(request, authorization)
    n = parse_index(limit, "limit", default=20, low=1, high=MAX_BATCHES_PAGE)
    rows = await files_db.batch_page(st.engine, tenant.id, after, n + 1)
    if rows is None:
        raise NotFound(f"no batch {shown(after)} to page after", field="after")
    data = [_object(b, j) for b, j in rows[:n]]
    return ORJSONResponse(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": len(rows) > n,
        }
    )
