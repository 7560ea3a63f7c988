"""OpenAI's Files API (decision 35): uploads of batch input files, and each batch's
output and error files.

An uploaded file is stored in PostgreSQL in chunks (results/files.py); an upload is
spooled to a temp file as it arrives (bounded memory) and stored in one transaction. A
batch's output and error files are views of its job's results (ingest/openai/
batches.py), streamed in input order and readable while it runs. Errors are in
OpenAI's shape (ingest/edge/error_shapes.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from core.errors import InvalidInput, NotFound, PayloadTooLarge
from core.limits import ascii_decimal
from core.vocab import ItemStatus
from ingest.acceptance.state import AppState, get_state
from ingest.edge.auth import Caller
from ingest.edge.error_shapes import Shape, declared
from ingest.edge.json_response import ORJSONResponse
from ingest.jobs.limits import HeldStream, hold_stream, slot
from ingest.jobs.routes import reader
from ingest.jobs.schemas import parse_index
from ingest.jobs.upload import upload_chunks
from ingest.openai import batch_wire as bw
from ingest.openai import file_budget as fb
from ingest.openai.completion_wire import completion_body
from ingest.openai.wire import EncodingFormat, embeddings_answer, list_page, prompt_tokens
from results import files as files_db
from results import jobs as jobs_db
from results.job_items import items_page
from results.jobs import item_status
from results.tenants import Tenant

router = APIRouter()
ERRORS = declared(Shape.OPENAI)

PURPOSES = ("batch",)  # the one purpose these files serve
MAX_FILES_PAGE = 10_000  # OpenAI's own bound on GET /v1/files?limit
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
    """The upload as the multipart parser reads it (an async generator), at most ``cap``
    bytes."""
    chunks = upload_chunks(request.stream(), st.settings, max_bytes=cap, what="a file upload")
    async for chunk in chunks:
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
async def create_file(request: Request, tenant: Caller) -> ORJSONResponse:
    st = get_state(request)
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
            new = files_db.NewFile(fid, tenant.id, purpose, name, size, expires_at=expires)
            await files_db.store_file(
                st.engine, new, upload.file, admit=lambda now_used: budget.check(now_used, size)
            )
        finally:
            await form.close()
    f = await files_db.get_file(st.engine, tenant.id, fid)
    return ORJSONResponse(file_object(f), headers=headers)


@router.get("/v1/files", responses=ERRORS)
async def list_files(
    request: Request,
    tenant: Caller,
    purpose: str | None = Query(default=None),
    limit: str | None = Query(default=None),
    after: str | None = Query(default=None),
    order: str = Query(default="desc"),
) -> ORJSONResponse:
    st = reader(request, tenant)
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
    return ORJSONResponse(list_page(data, more=len(rows) > n))


@dataclass(frozen=True)
class ResultFile:
    """One of a batch's result files: a view of its job's results."""

    batch: Any
    job: Any
    errors: bool  # the error file (else the output file)


async def _file(st: AppState, tenant: Tenant, file_id: str) -> ResultFile | Any:
    """The tenant's file ``file_id``: one of its batches' result files, or a file it
    uploaded; 404 naming it otherwise."""
    missing = NotFound(f"no file {file_id[:80]!r}")
    named = bw.result_file(file_id)
    if named is None:
        f = await files_db.get_file(st.engine, tenant.id, file_id)
        if f is None:
            raise missing
        return f
    batch_id, errors = named
    b = await files_db.get_batch(st.engine, tenant.id, batch_id)
    j = None if b is None else await jobs_db.get_job(st.engine, tenant.id, str(b.job_id))
    if b is None or j is None:
        raise missing
    if b.output_expires_at is not None and datetime.now(UTC) >= b.output_expires_at:
        raise NotFound(f"file {file_id[:80]!r} expired (output_expires_after)")
    return ResultFile(b, j, errors)


@router.get("/v1/files/{file_id}", responses=ERRORS)
async def get_file(request: Request, file_id: str, tenant: Caller) -> ORJSONResponse:
    f = await _file(reader(request, tenant), tenant, file_id)
    if not isinstance(f, ResultFile):
        return ORJSONResponse(file_object(f))
    b = f.batch
    return ORJSONResponse(
        {
            "id": file_id,
            "object": "file",
            # A growing view of the results: its size is known once it is read.
            "bytes": None,
            "created_at": _ts(b.created_at),
            "expires_at": _ts(b.output_expires_at),
            "filename": f"{b.batch_id}_{'error' if f.errors else 'output'}.jsonl",
            "purpose": "batch_output",
            "status": "processed",
            "status_details": None,
        }
    )


@router.delete("/v1/files/{file_id}", responses=ERRORS)
async def delete_file(request: Request, file_id: str, tenant: Caller) -> ORJSONResponse:
    st = reader(request, tenant)
    if bw.result_file(file_id) is not None:
        raise InvalidInput(
            "a batch's output and error files live as long as the batch; they cannot be deleted",
            field="file_id",
        )
    if not await files_db.delete_file(st.engine, tenant.id, file_id):
        raise NotFound(f"no file {file_id[:80]!r}")
    return ORJSONResponse({"id": file_id, "object": "file", "deleted": True})


@router.get("/v1/files/{file_id}/content", responses=ERRORS)
async def file_content(request: Request, file_id: str, tenant: Caller) -> StreamingResponse:
    st = reader(request, tenant)
    f = await _file(st, tenant, file_id)
    if isinstance(f, ResultFile):
        content = result_lines(st, f)
    else:
        content = files_db.file_chunks(st.engine, f.file_id)
    return HeldStream(content, hold_stream(st, tenant), media_type="application/jsonl")


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
    return {"request_id": rid, "status": ItemStatus.SUCCEEDED, "model": j.model, "output": r.output}


async def result_lines(st: AppState, f: ResultFile) -> AsyncIterator[bytes]:
    """The output (or error) lines in input order, a page of rows at a time; stops at
    the first item still running, so a file read mid-batch is a prefix of the final one."""
    b, j, errors = f.batch, f.job, f.errors
    pos, now = 0, datetime.now(UTC)
    while pos < j.total_items:
        rows = await items_page(st.engine, str(j.job_id), pos, RESULT_PAGE, inputs=True)
        out: list[bytes] = []
        for r in rows:
            status = item_status(r.status, j, now)
            if status == ItemStatus.QUEUED:
                if out:
                    yield b"".join(out)
                return
            ok = status == ItemStatus.SUCCEEDED
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
