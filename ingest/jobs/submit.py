"""Making a job durable: stage and validate every item, record the job, then put it
in Kafka (decisions 10 and 26).

1. The body is read at the client's pace into a temp file, each item validated as
   it arrives (ingest/jobs/upload.py); no database connection is held meanwhile.
2. One transaction COPYs the staged items into ``job_items``, charges the tenant's
   job-item budget and inserts the ``jobs`` row last: a crash or a refusal leaves
   nothing; a committed job is complete.
3. The job is ``submitting`` until its items are produced to Kafka
   (ingest/jobs/publisher.py); then it is ``submitted`` and the client gets 202.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from core.config import Settings
from core.errors import IdempotencyConflict, InvalidInput, NotFound, PayloadTooLarge, Unavailable
from core.ids import uuid7
from core.limits import canonical_uuid, check_object, shown
from core.models.spec import ModelSpec
from ingest.acceptance.state import AppState
from ingest.jobs import quota as job_quota
from ingest.jobs.destinations import AllowList, check_addresses, parse_destination
from ingest.jobs.incremental import check_base, scope_digest
from ingest.jobs.schemas import JobBody, JobOptions, check_metadata, validate
from ingest.jobs.upload import ItemStager, Staged, upload_chunks
from ingest.jobs.webhook_client import NotResolved, resolve
from ingest.jobs.webhook_events import new_secret
from results import jobs as jobs_db
from results.job_items import copy_items
from results.job_reuse import match_reusable
from results.job_submission import (
    NewJob,
    forget_expired_key,
    insert_job,
    job_for_key,
)
from results.tenants import Tenant


@dataclass
class Submission:
    """A validated job whose items are staged; nothing is written yet."""

    tenant: Tenant
    spec: ModelSpec
    params: dict[str, Any]
    window_s: int
    webhook_url: str | None
    metadata: dict[str, str] | None
    idempotency_key: str | None
    staged: Staged
    job_id: str = field(default_factory=uuid7)  # time-ordered: decision 72
    base_job_id: str | None = None  # checked: the tenant's, finished, same model version


@dataclass(frozen=True)
class Recorded:
    job_id: str
    created: bool  # False: an earlier submission with the same key and body
    webhook_secret: str | None = None


@dataclass(frozen=True)
class Options:
    """A job's options, checked: everything but its items."""

    spec: ModelSpec
    params: dict[str, Any]
    window_s: int
    webhook_url: str | None
    base_job_id: str | None

    def submission(
        self,
        tenant: Tenant,
        metadata: dict[str, str] | None,
        key: str | None,
        staged: Staged,
        job_id: str,
    ) -> Submission:
        """The job these options and its staged items make."""
        return Submission(
            tenant,
            self.spec,
            self.params,
            self.window_s,
            self.webhook_url,
            metadata,
            key,
            staged,
            job_id,
            self.base_job_id,
        )


async def check_options(st: AppState, tenant: Tenant, opts: JobOptions) -> Options:
    """The model, params, window, webhook destination and base job, or the 4xx naming
    the field."""
    s = st.settings
    # A job's items may wait in Kafka for a version no worker serves yet (loading).
    spec = await st.catalog.resolve(opts.model, wait_for_workers=True)
    if opts.params is not None:  # as /v1/infer's (ingest/native/wire.py): storable, capped
        check_object(
            opts.params, "params", max_bytes=s.max_params_bytes, max_depth=s.max_json_depth
        )
    params = spec.normalize_params(opts.params)
    window = (
        s.default_completion_window_s
        if opts.completion_window_s is None
        else (opts.completion_window_s)
    )
    if not 0 < window <= s.max_completion_window_s:
        raise InvalidInput(
            f"completion_window_s must be 1..{s.max_completion_window_s}",
            field="completion_window_s",
        )
    if opts.webhook_url is not None:
        await check_webhook(s, opts.webhook_url)
    base = None
    if opts.base_job_id is not None:
        base = await base_job(st, tenant, opts.base_job_id, spec)
    return Options(spec, params, window, opts.webhook_url, base)


async def base_job(
    st: AppState, tenant: Tenant, raw_id: str, spec: ModelSpec, field: str = "base_job_id"
) -> str:
    """The id of the tenant's job ``raw_id`` once it may lend its results to a job of
    ``spec``; another tenant's job is a 404 like one that does not exist."""
    jid = canonical_uuid(raw_id)
    base = None if jid is None else await jobs_db.get_job(st.engine, tenant.id, jid)
    if base is None:
        raise NotFound(f"no job {shown(raw_id)} to use as {field}", field=field)
    check_base(base, spec.name, spec.version, field)
    return str(base.job_id)


async def check_webhook(settings: Settings, url: str) -> None:
    """400 unless the URL is well formed and resolves only to addresses webhooks may
    reach (checked again at every delivery: ingest/jobs/webhook_client.py)."""
    dest = parse_destination(url)
    try:
        async with asyncio.timeout(settings.webhook_timeout_s):
            addresses = await resolve(dest.host, dest.port)
    except (NotResolved, TimeoutError):
        addresses = []
    check_addresses(dest, addresses, AllowList.parse(settings.webhook_allow_networks))


def item_stager(
    st: AppState, tenant: Tenant, spec: ModelSpec, params: dict[str, Any], job_id: str
) -> ItemStager:
    """``params``: the job's, normalised (they are in each item's content hash)."""
    s = st.settings
    return ItemStager(
        job_id,
        spec,
        max_items=s.max_job_items,
        max_line=s.max_body_bytes,
        max_depth=s.max_json_depth,
        folder=s.upload_dir,
        scope=scope_digest(tenant.id, spec.name, spec.version, params),
    )


async def stage_json(
    st: AppState, tenant: Tenant, stream: AsyncIterator[bytes], key: str | None
) -> Submission:
    """A JSON job body: read (capped as it arrives), parsed, every item staged."""
    s = st.settings
    raw = b"".join(
        [
            c
            async for c in upload_chunks(
                stream,
                s,
                max_bytes=s.max_job_json_bytes,
                what="a JSON job body (upload large jobs as JSONL, application/x-ndjson)",
            )
        ]
    )
    if not raw.strip():
        raise InvalidInput("request body is empty; expected a JSON object")
    try:
        data = await asyncio.to_thread(orjson.loads, raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}") from exc
    body = validate(data, JobBody)
    if len(body.items) > s.max_job_json_items:
        raise PayloadTooLarge(
            f"a JSON job may hold at most {s.max_job_json_items} items; upload larger "
            "jobs as JSONL (application/x-ndjson)"
        )
    check_metadata(body.metadata)
    opts = await check_options(st, tenant, body)
    job_id = uuid7()  # its items' ids follow its time (decision 72)
    stager = item_stager(st, tenant, opts.spec, opts.params, job_id)
    stager.hasher.update(raw)

    def stage_all() -> Staged:
        for i, obj in enumerate(body.items):
            stager.add_object(obj, f"items[{i}]")
        return stager.finish()

    try:
        staged = await asyncio.to_thread(stage_all)
    except BaseException:
        stager.close()
        raise
    return opts.submission(tenant, body.metadata, key, staged, job_id)


async def stage_jsonl(
    st: AppState,
    tenant: Tenant,
    stream: AsyncIterator[bytes],
    opts_in: JobOptions,
    key: str | None,
) -> Submission:
    """A JSONL upload: options from the query, then one item per line, staged as the
    lines arrive."""
    s = st.settings
    opts = await check_options(st, tenant, opts_in)
    job_id = uuid7()  # its items' ids follow its time (decision 72)
    stager = item_stager(st, tenant, opts.spec, opts.params, job_id)
    base = [opts_in.base_job_id] if opts_in.base_job_id is not None else []  # old hashes hold
    stager.hasher.update(
        orjson.dumps(
            [opts_in.model, opts_in.params, opts_in.completion_window_s, opts_in.webhook_url, *base]
        )
    )
    try:
        async for chunk in upload_chunks(stream, s, max_bytes=s.max_job_bytes, what="a job upload"):
            t0 = time.monotonic()
            await asyncio.to_thread(stager.feed, chunk)
            if st.jobs.pacer is not None:  # staging gives way too (ingest/jobs/pacing.py)
                await asyncio.sleep(st.jobs.pacer.after(time.monotonic() - t0))
        staged = await asyncio.to_thread(stager.finish)
    except BaseException:
        stager.close()
        raise
    return opts.submission(tenant, None, key, staged, job_id)


class _KeyTaken(Exception):
    """A concurrent submission recorded a job with the same Idempotency-Key first."""


def _replay(prev: Any, sub: Submission) -> Recorded:
    if prev.body_hash != sub.staged.body_hash:
        raise IdempotencyConflict(
            "Idempotency-Key was already used with a different job", field="Idempotency-Key"
        )
    return Recorded(str(prev.job_id), False)


async def record_job(st: AppState, sub: Submission) -> Recorded:
    """Phase 1: the staged items, the budget charge and the job row, in one transaction."""
    s = st.settings
    tenant, key = sub.tenant, sub.idempotency_key
    secret = new_secret() if sub.webhook_url else None
    try:
        async with (st.bulk_engine or st.engine).begin() as conn:
            if key is not None:
                await forget_expired_key(conn, tenant.id, key, s.idempotency_ttl_h)
                prev = await job_for_key(conn, tenant.id, key)
                if prev is not None:
                    return _replay(prev, sub)
            await copy_items(conn, sub.staged.file)
            reused = frozenset[int]()
            if sub.base_job_id is not None:
                # Only which items: their rows are copied by the publish, while the
                # model computes the rest (results/job_reuse.py).
                reused = await match_reusable(
                    conn, job_id=sub.job_id, base_job_id=sub.base_job_id, tenant_id=tenant.id
                )
            # Charged after the COPY: the budget's row lock lasts only until the commit.
            # Only computed items are charged: the budget paces work for the GPUs.
            await job_quota.charge(conn, s, tenant, sub.staged.count - len(reused))
            now = datetime.now(UTC)
            created = await insert_job(
                conn,
                NewJob(
                    job_id=sub.job_id,
                    tenant_id=tenant.id,
                    model=sub.spec.name,
                    model_version=sub.spec.version,
                    params=sub.params,
                    metadata=sub.metadata,
                    total_items=sub.staged.count,
                    expires_at=datetime.now(UTC) + timedelta(seconds=sub.window_s),
                    idempotency_key=key,
                    body_hash=sub.staged.body_hash,
                    webhook_url=sub.webhook_url,
                    webhook_secret=secret,
                    base_job_id=sub.base_job_id,
                    started_at=now if reused else None,
                ),
            )
            if not created:
                raise _KeyTaken  # rolls back our items and our charge
    except _KeyTaken:
        assert key is not None
        async with st.engine.connect() as conn:
            prev = await job_for_key(conn, tenant.id, key)
        if prev is None:  # the other submission's key expired meanwhile: very unlikely
            raise Unavailable(
                "a concurrent submission holds this key; retry", retry_after_s=1
            ) from None
        return _replay(prev, sub)
    sub.staged.reused = reused  # its publish sends only the items left to compute
    return Recorded(sub.job_id, True, secret)
