"""Completion-time quotes for jobs, the I/O half: the live capacity and the sync
classes' take from this instance's admission state, the model's job backlog from
PostgreSQL; the policy is ingest/jobs/quote.py (decision 69)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from core.errors import Conflict
from core.models.spec import ModelSpec
from core.vocab import PRIORITY_CLASSES, JobStatus, PriorityClass
from ingest.acceptance.state import AppState
from ingest.admission.capacity import LONG_RATE_WINDOW_S
from ingest.admission.served import ServedHistory, blended_rate
from ingest.jobs import quote
from ingest.jobs.quote import Pending, completion_at, finishes, in_place, job_rate, queued_now
from ingest.jobs.submit import Submission
from results import job_backlog
from results.jobs import finished_count, job_status
from results.tenants import Tenant

log = logging.getLogger(__name__)
# The classes served before job items (all above the jobs class).
_AHEAD_OF_JOBS = PRIORITY_CLASSES[: PriorityClass.JOBS.rank]


def jobs_rate(st: AppState, ref: str, horizon_s: float = 0.0) -> float:
    """Items/s left to the jobs class of a model: the live workers' capacity less what
    the classes above take (what every API instance admitted, from this instance's
    counts times the instances). Over a ``horizon_s`` longer than admission's long
    window, their mean rate over as long a past (up to an hour); else, as admission
    reads it, the larger of their rates over its two windows."""
    load = st.load
    view = load.view
    capacity = view.capacity.get(ref) if view is not None else None
    if capacity is None or capacity.workers <= 0:
        return 0.0
    now = time.monotonic()
    adm = load.admission
    if horizon_s > LONG_RATE_WINDOW_S:
        taken = sum(
            adm.admitted_history.rate_over((ref, c), now, horizon_s) for c in _AHEAD_OF_JOBS
        )
    else:
        taken = sum(
            max(adm.admitted.rate((ref, c), now), adm.admitted_long.rate((ref, c), now))
            for c in _AHEAD_OF_JOBS
        )
    return job_rate(capacity.items_s, taken * max(1, load.limiter.instances))


def _pending(st: AppState, ref: str, rows: Sequence[Any]) -> list[Pending]:
    """The backlog read's rows, each read also a sample of what jobs were served."""
    pending = [
        Pending(str(r.job_id), str(r.tenant_id), r.created_at, float(r.remaining), r.weight)
        for r in rows
    ]
    view = st.load.view
    capacity = view.capacity.get(ref) if view is not None else None
    history = st.served.setdefault(ref, ServedHistory())
    history.record(
        time.monotonic(),
        {p.job_id: p.remaining for p in pending},
        capacity.items_s if capacity is not None else 0.0,
    )
    return pending


def read_window(st: AppState, ref: str, stream: Sequence[Pending]) -> float:
    """How much of ``stream`` the schedulers hold read, from their load reports: what
    weighted sharing divides; the rest waits in Kafka in submission order (decision 9's
    limit, ``quote.read_window``)."""
    view = st.load.view
    if view is None:
        return math.inf
    jobs = PriorityClass.JOBS.value
    held = view.backlog.get(ref, {}).get(jobs, 0)
    by_tenant = view.tenants.get(ref, {}).get(jobs) or {}
    return quote.read_window(stream, held, {t: q for t, (q, _) in by_tenant.items()})


def rate_over(st: AppState, ref: str, horizon_s: float) -> float:
    """The rate jobs of ``ref`` get over the next ``horizon_s`` (decision 69): the
    prediction (``jobs_rate``), and for as much of the horizon as it covers, what they
    were seen to get over as long a past. Now (0): the prediction alone."""
    predicted = jobs_rate(st, ref, horizon_s)
    history = st.served.get(ref)
    if horizon_s <= 0 or history is None:
        return predicted
    return blended_rate(predicted, history.rate(horizon_s), horizon_s)


def _seconds(at: float | None) -> int | None:
    return None if at is None else math.ceil(at)


async def job_estimates(
    st: AppState, rows: Sequence[Any], weight: float, now: datetime
) -> dict[str, int | None]:
    """Each job's ``estimated_completion_at`` (unix seconds): None once it is finished,
    cancelled or expired, or while no worker serves its model. ``rows``: one tenant's
    jobs (of weight ``weight``); one backlog read per model version among them."""
    out: dict[str, int | None] = {str(j.job_id): None for j in rows}
    live = [j for j in rows if job_status(j, now) in (JobStatus.QUEUED, JobStatus.RUNNING)]
    by_ref: dict[tuple[str, str], list[Any]] = {}
    for j in live:
        by_ref.setdefault((j.model, j.model_version), []).append(j)
    for (model, version), js in by_ref.items():
        ref = f"{model}@{version}"
        if jobs_rate(st, ref) <= 0:
            continue
        backlog = await job_backlog.pending_jobs(st.engine, model, version, now)
        own = [  # each with its own count, read a moment after the backlog
            Pending(
                str(j.job_id),
                str(j.tenant_id),
                j.created_at,
                float(j.total_items - finished_count(j)),
                weight,
            )
            for j in js
        ]
        stream = in_place(_pending(st, ref, backlog), own)
        work = finishes(stream, read_window(st, ref, stream))  # one pass for every job listed
        at = {p.job_id: w for p, w in zip(stream, work, strict=True)}
        rate = partial(rate_over, st, ref)
        for p in own:
            out[p.job_id] = _seconds(completion_at(now.timestamp(), rate, at[p.job_id]))
    return out


async def job_estimate(st: AppState, j: Any, weight: float) -> int | None:
    return (await job_estimates(st, [j], weight, datetime.now(UTC)))[str(j.job_id)]


async def new_job_quote(
    st: AppState, tenant: Tenant, spec: ModelSpec, items: int, now: datetime
) -> int | None:
    """When a job of ``items`` items submitted now would finish, behind all of the
    tenant's unfinished jobs of the model; None while no worker serves it. A flex
    request's 202 is quoted so too (its unanswered inputs: ``flex_quote``)."""
    if jobs_rate(st, spec.ref) <= 0:
        return None
    rows = await job_backlog.pending_jobs(st.engine, spec.name, spec.version, now)
    pending = _pending(st, spec.ref, rows)
    stream, k = queued_now(tenant.id, float(items), tenant.weight, now, pending)
    work = finishes(stream, read_window(st, spec.ref, stream))[k]
    return _seconds(completion_at(now.timestamp(), partial(rate_over, st, spec.ref), work))


async def flex_quote(st: AppState, tenant: Tenant, spec: ModelSpec, items: int) -> int | None:
    """A flex request's quote for its 202 (AppState.quote_flex, wired in services.py:
    the acceptance pipeline sits below jobs and cannot import this). The request is
    accepted by now: a failed backlog read costs its quote, never its 202."""
    try:
        return await new_job_quote(st, tenant, spec, items, datetime.now(UTC))
    except (SQLAlchemyError, OSError) as exc:
        log.warning("flex quote of %s left out: %s", spec.ref, exc)
        return None


async def check_window(st: AppState, sub: Submission, now: datetime) -> None:
    """Refuse a submission whose window its quote says cannot be met. Not checked for
    a retry of a recorded Idempotency-Key (answered with its job) nor for an incremental
    job (its reused items are known only as it is recorded: its count over-states it)."""
    if sub.base_job_id is not None:
        return
    key = sub.idempotency_key
    if key is not None and await job_backlog.key_has_job(st.engine, sub.tenant.id, key):
        return
    quote = await new_job_quote(st, sub.tenant, sub.spec, sub.staged.count, now)
    refuse_unmeetable(quote, sub.window_s, now)


def refuse_unmeetable(quote: int | None, window_s: int, now: datetime) -> None:
    """409 naming ``completion_window_s`` and the earliest completion when the quote
    falls past the window; no quote (no worker serves the model yet): accepted."""
    if quote is None or quote <= now.timestamp() + window_s:
        return
    earliest_s = math.ceil(quote - now.timestamp())
    at = datetime.fromtimestamp(quote, UTC).isoformat()
    raise Conflict(
        f"completion_window_s of {window_s} s cannot be met at the current load: the "
        f"earliest this job could complete is {at} (unix {quote}, {earliest_s} s from "
        f"now); send completion_window_s >= {earliest_s}, or submit fewer items",
        field="completion_window_s",
    )
