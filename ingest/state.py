"""Per-process state of an API instance, built once at startup."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from sqlalchemy.ext.asyncio import AsyncEngine

from core.config import Settings
from ingest.auth import Authenticator
from ingest.catalog import ModelCatalog
from ingest.job_submit import JobPublisher
from ingest.load_watch import LoadWatch
from ingest.overload import Overload
from ingest.producer import AsyncProducer
from ingest.ratelimit import InflightLimiter, TenantLimiter
from ingest.shared_slots import SharedSlots
from ingest.streams import StreamHub
from ingest.waiters import ResultWaiter


@dataclass
class AppState:
    settings: Settings
    engine: AsyncEngine
    producer: AsyncProducer
    auth: Authenticator
    catalog: ModelCatalog
    waiter: ResultWaiter
    jobs: JobPublisher
    limiter: TenantLimiter
    inflight: InflightLimiter
    load: LoadWatch
    overload: Overload
    # Counted per instance, across its processes (ingest/shared_slots.py):
    uploads: SharedSlots  # job and file uploads being staged and recorded
    follows: SharedSlots  # follow=true result streams
    read_streams: SharedSlots  # every other streamed answer (tier_max_streams per key)
    streams: StreamHub | None = None  # made on the first token stream (ingest/completions.py)


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.gristmill
    return state
