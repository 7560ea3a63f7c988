"""The API process's state on the real Kafka and PostgreSQL, and its background tasks:
made when it starts, ended in order when it stops (``live_services``, what
ingest/app.py runs by default)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

from core.config import Settings
from core.gc_tuning import tune_gc
from core.memory import trim_periodically
from core.topics import all_request_topics, ensure_topics
from ingest.acceptance.catalog import ModelCatalog
from ingest.acceptance.idempotency import KeyClaims
from ingest.acceptance.producer import AsyncProducer
from ingest.acceptance.state import AppState
from ingest.acceptance.waiters import ResultWaiter
from ingest.admission.load_watch import LoadWatch
from ingest.admission.overload import Overload
from ingest.admission.ratelimit import InflightLimiter, TenantLimiter
from ingest.admission.shared_slots import InstanceSlots, slots_dir
from ingest.edge.auth import Authenticator
from ingest.edge.db_health import DatabaseHealth
from ingest.edge.readiness import Readiness
from ingest.edge.request_log_flush import flush_loop, flush_once
from ingest.jobs.estimates import flex_quote
from ingest.jobs.pacing import Pacer, target_lag_ms
from ingest.jobs.publisher import JobPublisher
from ingest.jobs.webhooks import webhook_loop
from ingest.operations.metrics import job_gauges_loop, publish_loop
from ingest.operations.stalls import StallWatch
from results.db import make_async_engine, make_bulk_engine
from results.durability import refusal

log = logging.getLogger(__name__)

# Makes an API process's state for its lifetime (the app's lifespan enters it).
Services = Callable[[Settings], AbstractAsyncContextManager[AppState]]

# How long a thread may hold the interpreter lock while the event loop waits for it (s;
# Python's default is 5 ms).
GIL_SWITCH_S = 0.0005


async def finish_stale_submissions(state: AppState, interval_s: float = 5.0) -> None:
    """Finish phase 2 of job submissions whose API instance died mid-way."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            job_id = await state.jobs.claim_stale()
            if job_id is not None:
                log.warning("finishing the submission of job %s left by another instance", job_id)
                await state.jobs.publish(job_id)
        except Exception as exc:  # Kafka or PostgreSQL away: the next pass retries
            log.warning("stale submission pass failed: %s", exc)


async def check_durability_at_start(settings: Settings) -> None:
    """Outside development, refuse to start on Kafka or PostgreSQL settings that could
    lose what this API acknowledges (decision 20), naming each setting; services that
    cannot be reached to check are a refusal too (the process manager starts it again)."""
    if settings.allow_weak_durability:
        log.warning("allow_weak_durability is set: Kafka and PostgreSQL durability unchecked")
        return
    try:
        why = await asyncio.to_thread(refusal, settings)
    except Exception as exc:
        why = f"refusing to start: cannot check Kafka and PostgreSQL durability ({exc})"
    if why is not None:
        log.error("%s", why)
        raise RuntimeError(why)


@contextlib.asynccontextmanager
async def live_services(settings: Settings) -> AsyncIterator[AppState]:
    try:
        ensure_topics(settings, timeout_s=10)
    except Exception as exc:  # the API still starts; produce answers 503 until Kafka is back
        log.warning("could not check Kafka topics: %s", exc)
    await check_durability_at_start(settings)
    # The event loop waits for the interpreter lock behind a job's intake threads;
    # hand it over sooner (as the scheduler does, scheduler/runtime/service.py).
    sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
    engine = make_async_engine(settings.database_url)
    limiter = TenantLimiter()
    overload = Overload()
    waiter = ResultWaiter(
        engine, settings.database_url, poll_interval_s=settings.result_poll_interval_ms / 1000
    )
    auth = Authenticator(engine, settings)
    # The instance's processes count their open work together (decision 43).
    slots = InstanceSlots.open(slots_dir(), settings)
    # Every sign of the database feeds one judgement (ingest/edge/db_health.py): the
    # probe, the load watch's heartbeat commits, the result announcements heard.
    health = DatabaseHealth(stale_s=settings.load_report_stale_s)
    producer = AsyncProducer(settings, timeout_ms=settings.produce_timeout_ms)
    state = AppState(
        settings=settings,
        engine=engine,
        producer=producer,
        waiter=waiter,
        keys=KeyClaims(engine, ttl_h=settings.idempotency_ttl_h),
        jobs=JobPublisher(
            settings,
            Pacer(lambda: overload.lag.lag_ms, target_lag_ms(settings.loop_lag_shed_ms)),
            child=settings.job_publish_process,
        ),
        auth=auth,
        catalog=ModelCatalog(
            settings,
            engine,
            database_url=settings.database_url,
            deployment=settings.topic_prefix,
        ),
        limiter=limiter,
        inflight=InflightLimiter(settings.max_inflight, settings.inflight_share),
        flex_waits=InflightLimiter(settings.max_flex_waits, {}),
        load=LoadWatch(engine, settings, limiter),
        overload=overload,
        uploads=slots.uploads,
        follows=slots.follows,
        read_streams=slots.read_streams,
        readiness=Readiness(
            engine,
            refresh_s=settings.readyz_refresh_s,
            listening=waiter.listening.is_set,
            revocations=lambda: auth.listening,
            health=health,
        ),
        bulk_engine=make_bulk_engine(settings.database_url),
    )
    state.quote_flex = functools.partial(flex_quote, state)
    state.load.health = health
    state.catalog.health = health
    waiter.on_heard = health.heard
    # The request topics' leaders learned before the first request, not on it: a fresh
    # system's first second of sync requests paid up to a quarter second more to produce.
    await asyncio.to_thread(producer.warm, all_request_topics(settings), 5.0)
    await waiter.start()
    await auth.start()
    # What start-up made lives as long as the process: frozen out of the collector's
    # sight, its full passes walk only what requests make (bench/api_cpu.py, same box,
    # same code with and without: 143-152 against 124 us of CPU a request, decision 49);
    # young collections are rarer (core/gc_tuning.py).
    tune_gc()
    background = [
        asyncio.create_task(state.readiness.run()),
        asyncio.create_task(webhook_loop(engine, settings)),
        asyncio.create_task(finish_stale_submissions(state)),
        asyncio.create_task(state.load.run()),
        asyncio.create_task(state.overload.lag.run()),
        asyncio.create_task(publish_loop(state)),
        asyncio.create_task(job_gauges_loop(state)),
        asyncio.create_task(flush_loop(engine)),  # refusal counts, answer timeouts
        asyncio.create_task(state.catalog.run()),
        asyncio.create_task(trim_periodically()),  # malloc's free pages back (core/memory.py)
    ]
    if settings.loop_stall_log_ms > 0:
        background.append(asyncio.create_task(StallWatch(settings.loop_stall_log_ms).run()))
    try:
        yield state
    finally:
        for task in background:
            task.cancel()
        with contextlib.suppress(Exception):  # the database may be the thing that is gone
            await state.load.leave()
        with contextlib.suppress(Exception):
            await flush_once(engine, everything=True)
        await waiter.stop()
        await auth.stop()
        state.producer.close()
        state.jobs.close()
        slots.close()
        await engine.dispose()
        if state.bulk_engine is not None:
            await state.bulk_engine.dispose()
