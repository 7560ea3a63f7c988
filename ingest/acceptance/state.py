"""Per-process state of an API instance, built once at startup (ingest/app.py's
``live_services``; unit tests build it around in-memory stand-ins)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from sqlalchemy.ext.asyncio import AsyncEngine

from core.config import Settings
from ingest.acceptance.catalog import ModelCatalog
from ingest.acceptance.ports import IdempotencyKeys, JobQueue, RequestProducer, Waiter
from ingest.admission.load_watch import LoadWatch
from ingest.admission.overload import Overload
from ingest.admission.ratelimit import InflightLimiter, TenantLimiter
from ingest.admission.shared_slots import SharedSlots
from ingest.edge.auth import Authenticator
from ingest.edge.readiness import Readiness


@dataclass
class AppState:
    settings: Settings
    engine: AsyncEngine  # the results/ reads and writes the routes make themselves
    producer: RequestProducer
    waiter: Waiter
    keys: IdempotencyKeys
    jobs: JobQueue
    auth: Authenticator
    catalog: ModelCatalog
    limiter: TenantLimiter
    inflight: InflightLimiter
    flex_waits: InflightLimiter  # flex calls held open for their answers (decision 66)
    load: LoadWatch
    overload: Overload
    # Counted per instance, across its processes (ingest/admission/shared_slots.py):
    uploads: SharedSlots  # job and file uploads being staged and recorded
    follows: SharedSlots  # follow=true result streams
    read_streams: SharedSlots  # every other streamed answer (tier_max_streams per key)
    readiness: Readiness
    # Jobs' COPYs, each on a connection of its own (results/db.py make_bulk_engine);
    # None: the shared engine.
    bulk_engine: AsyncEngine | None = None


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.gristmill
    return state
