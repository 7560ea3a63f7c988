"""Per-process state of an API instance, built once at startup."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from sqlalchemy.ext.asyncio import AsyncEngine

from core.config import Settings
from ingest.acceptance.catalog import ModelCatalog
from ingest.acceptance.producer import AsyncProducer
from ingest.acceptance.streams import StreamHub
from ingest.acceptance.waiters import ResultWaiter
from ingest.admission.load_watch import LoadWatch
from ingest.admission.overload import Overload
from ingest.admission.ratelimit import InflightLimiter, SlotLimiter, TenantLimiter
from ingest.edge.auth import Authenticator
from ingest.jobs.submit import JobPublisher


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
    uploads: SlotLimiter  # job uploads being staged and recorded
    follows: SlotLimiter  # follow=true result streams
    # Made on the first token stream (ingest/openai/completions.py).
    streams: StreamHub | None = None


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.gristmill
    return state
