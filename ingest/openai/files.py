"""OpenAI's Files API (decision 35): uploads of batch input files, and each batch's
output and error files.

An uploaded file is stored in PostgreSQL in chunks (results/files.py); an upload is
spooled to a temp file as it arrives (bounded memory) and stored in one transaction. A
batch's output and error files are views of its job's results (ingest/openai/
batches.py), streamed in input order and readable while it runs. Errors are in
OpenAI's shape (ingest/edge/error_shapes.py).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import ORJSONResponse, StreamingResponse
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from core.errors import InvalidInput, NotFound, PayloadTooLarge
from core.vocab import ItemStatus
from ingest.acceptance.state import AppState, get_state
from ingest.edge.auth import Caller
from ingest.edge.error_shapes import Shape, declared
from ingest.jobs.limits import slot
from ingest.jobs.routes import reader
from ingest.jobs.schemas import parse_index
from ingest.jobs.upload import body_chunks
from ingest.openai import batch_wire as bw
from ingest.openai.completion_wire import completion_body
from ingest.openai.wire import EncodingFormat, embeddings_answer, prompt_tokens
from results import files as files_db
from results import jobs as jobs_db
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


async def _capped(request: Request, st: AppState) -> AsyncGenerator[bytes, None]:
    s = st.settings
    async for chunk in body_chunks(
        request.stream(),
        idle_timeout_s=s.upload_idle_timeout_s,
        max_bytes=s.max_job_bytes,
        what="a file upload",
        min_rate_bps=s.upload_min_bytes_per_s,
    ):
        yield chunk


@router.post("/v1/files", responses=ERRORS, summary="Upload a JSONL file (purpose=batch)")
async def create_file(
    request: Request, tenant: Caller
) -> ORJSONResponse:
    st = get_state(request)
    ctype = request.headers.get("content-type", "")
    if not ctype.startswith("multipart/form-data"):
        raise InvalidInput("POST /v1/files takes multipart/form-data", field="Content-Type")
    declared_len = request.headers.get("content-length", "")
    if declared_len.isdigit() and int(declared_len) > st.settings.max_job_bytes:
        raise PayloadTooLarge(f"a file may be at most {st.settings.max_job_bytes} bytes")
    async with slot(st.uploads, tenant.id, "uploads"):
        # The parser spools the file part to disk past 1 MiB: memory stays bounded.
        parser = MultiPartParser(request.headers, _capped(request, st), max_files=1, max_fields=4)
        try:
            form = await parser.parse()
        except MultiPartException as exc:
            raise InvalidInput(f"the multipart body is malformed: {exc.message}") from exc
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
            fid = bw.new_file_id()
            await files_db.store_file(
                st.engine,
                file_id=fid,
                tenant_id=tenant.id,
                purpose=purpose,
                filename=name,
                staged=upload.file,
                size=size,
                expires_at=None,
            )
        finally:
            await form.close()
    f = await files_db.get_file(st.engine, tenant.id, fid)
    return ORJSONResponse(file_object(f))


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
    request: Request, file_id: str, tenant: Caller
) -> ORJSONResponse:
    st = reader(request, tenant)
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
    request: Request, file_id: str, tenant: Caller
) -> ORJSONResponse:
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
async def file_content(
    request: Request, file_id: str, tenant: Caller
) -> StreamingResponse:
    st = reader(request, tenant)
    result = await _result_file(st, tenant, file_id)
    if result is not None:
        b, j, errors = result
        return StreamingResponse(result_lines(st, b, j, errors), media_type="application/jsonl")
    f = await _uploaded_file(st, tenant, file_id)
    return StreamingResponse(
        files_db.file_chunks(st.engine, f.file_id), media_type="application/jsonl"
    )


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


async def result_lines(st: AppState, b: Any, j: Any, errors: bool) -> AsyncIterator[bytes]:
    """The output (or error) lines in input order, a page of rows at a time; stops at
    the first item still running, so a file read mid-batch is a prefix of the final one."""
    pos, now = 0, datetime.now(UTC)
    while pos < j.total_items:
        rows = await files_db.result_page(st.engine, str(j.job_id), pos, RESULT_PAGE)
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
