"""OpenAI's Files and Batches: uploaded files stored as chunks, and the batch objects
that name a job (decision 35). Every query is scoped to the tenant. A file past its
``expires_at`` is gone for its tenant (neither listed, read nor counted against its
quota) and the sweeper deletes it (results/sweeper.py, decision 42)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import IO, Any

from sqlalchemy import ColumnElement, and_, delete, func, insert, or_, select, text, tuple_
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from results.jobs import job_rows
from results.schema import jobs, openai_batches, stored_file_chunks, stored_files

# Bytes per stored chunk: an upload or a download holds one at a time (1 MiB: large
# enough that a 1 GB file is ~1,000 rows, small enough to be nothing in memory).
CHUNK_BYTES = 1 << 20
# The advisory lock namespace ("gmfi") under which one tenant's files are stored one at a
# time, so the quota check and the insert are one step.
_FILES_LOCK = 0x676D6669


@dataclass(frozen=True)
class FileUsage:
    bytes: int
    files: int


def _live() -> ColumnElement[bool]:
    t = stored_files.c
    return or_(t.expires_at.is_(None), t.expires_at > func.now())


def _usage_stmt(tenant_id: str) -> Any:
    t = stored_files.c
    return select(func.count(), func.coalesce(func.sum(t.bytes), 0)).where(
        t.tenant_id == tenant_id, _live()
    )


async def usage(engine: AsyncEngine, tenant_id: str) -> FileUsage:
    """What the tenant keeps now: bytes and files not expired."""
    async with engine.connect() as conn:
        n, size = (await conn.execute(_usage_stmt(tenant_id))).one()
    return FileUsage(int(size), int(n))


@dataclass(frozen=True)
class NewFile:
    """A ``stored_files`` row to write (its fields are the row's columns)."""

    file_id: str
    tenant_id: str
    purpose: str
    filename: str
    bytes: int
    expires_at: datetime | None


async def store_file(
    engine: AsyncEngine, f: NewFile, staged: IO[bytes], admit: Callable[[FileUsage], None]
) -> None:
    """The file row and its staged bytes, chunk by chunk, in one transaction: a file is
    listed only once all of it is stored. ``admit`` sees the tenant's usage under the
    tenant's lock first and raises to refuse (its quota): concurrent uploads of one
    tenant are stored one after another, each seeing the one before."""
    staged.seek(0)
    async with engine.begin() as conn:
        await conn.execute(
            text("SELECT pg_advisory_xact_lock(:ns, hashtext(:t))"),
            {"ns": _FILES_LOCK, "t": f.tenant_id},
        )
        n, used = (await conn.execute(_usage_stmt(f.tenant_id))).one()
        admit(FileUsage(int(used), int(n)))
        await conn.execute(insert(stored_files).values(**asdict(f)))
        seq = 0
        while block := staged.read(CHUNK_BYTES):
            await conn.execute(
                insert(stored_file_chunks).values(file_id=f.file_id, seq=seq, data=block)
            )
            seq += 1


async def _first(engine: AsyncEngine, q: Any) -> Row[Any] | None:
    async with engine.connect() as conn:
        return (await conn.execute(q)).first()


async def get_file(engine: AsyncEngine, tenant_id: str, file_id: str) -> Row[Any] | None:
    t = stored_files.c
    return await _first(
        engine, select(stored_files).where(t.file_id == file_id, t.tenant_id == tenant_id, _live())
    )


async def list_files(
    engine: AsyncEngine,
    tenant_id: str,
    *,
    purpose: str | None,
    after: Row[Any] | None,
    limit: int,
    newest_first: bool,
) -> Sequence[Row[Any]]:
    """A page of the tenant's files ordered by (created_at, file_id), after ``after``."""
    t = stored_files.c
    q = select(stored_files).where(t.tenant_id == tenant_id, _live())
    if purpose is not None:
        q = q.where(t.purpose == purpose)
    key = tuple_(t.created_at, t.file_id)
    if after is not None:
        mark = tuple_(after.created_at, after.file_id)
        q = q.where(key < mark if newest_first else key > mark)
    order = (t.created_at.desc(), t.file_id.desc()) if newest_first else (t.created_at, t.file_id)
    async with engine.connect() as conn:
        return (await conn.execute(q.order_by(*order).limit(limit))).all()


async def delete_file(engine: AsyncEngine, tenant_id: str, file_id: str) -> bool:
    async with engine.begin() as conn:
        res = await conn.execute(
            delete(stored_files).where(
                stored_files.c.file_id == file_id, stored_files.c.tenant_id == tenant_id
            )
        )
        return bool(res.rowcount)


async def file_chunks(engine: AsyncEngine, file_id: str) -> AsyncIterator[bytes]:
    """The file's bytes, one chunk per query (no transaction held across chunks)."""
    seq = 0
    while True:
        async with engine.connect() as conn:
            data = (
                await conn.execute(
                    select(stored_file_chunks.c.data).where(
                        stored_file_chunks.c.file_id == file_id, stored_file_chunks.c.seq == seq
                    )
                )
            ).scalar()
        if data is None:
            return
        yield bytes(data)
        seq += 1


async def insert_batch(conn: AsyncConnection, values: dict[str, Any]) -> None:
    await conn.execute(insert(openai_batches).values(**values))


async def get_batch(engine: AsyncEngine, tenant_id: str, batch_id: str) -> Row[Any] | None:
    b = openai_batches.c
    return await _first(
        engine, select(openai_batches).where(b.batch_id == batch_id, b.tenant_id == tenant_id)
    )


async def batch_page(
    engine: AsyncEngine, tenant_id: str, after: str | None, limit: int
) -> list[tuple[Row[Any], Row[Any]]] | None:
    """A page of the tenant's batches, newest first, after the batch ``after`` (OpenAI's
    cursor), each with its job: three statements on one connection, however long the
    page. None when the tenant has no batch ``after``."""
    b = openai_batches.c
    q = select(openai_batches).where(b.tenant_id == tenant_id)
    async with engine.connect() as conn:
        if after is not None:
            mark = (
                await conn.execute(
                    select(b.created_at, b.batch_id).where(
                        b.batch_id == after, b.tenant_id == tenant_id
                    )
                )
            ).first()
            if mark is None:
                return None
            q = q.where(
                or_(
                    b.created_at < mark.created_at,
                    and_(b.created_at == mark.created_at, b.batch_id < mark.batch_id),
                )
            )
        rows = (
            await conn.execute(q.order_by(b.created_at.desc(), b.batch_id.desc()).limit(limit))
        ).all()
        if not rows:
            return []
        found = await conn.execute(
            job_rows().where(
                jobs.c.job_id.in_([r.job_id for r in rows]), jobs.c.tenant_id == tenant_id
            )
        )
        by_id = {str(j.job_id): j for j in found}
    return [(r, by_id[str(r.job_id)]) for r in rows if str(r.job_id) in by_id]
