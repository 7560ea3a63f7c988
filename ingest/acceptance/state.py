"""Per-process state of an API instance, built once at startup (ingest/app.py's
``live_services``; unit tests build it around in-memory stand-ins)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from fastapi import Request
from sqlalchemy.ext.asyncio import AsyncEngine

from core.config import Settings
from core.models.spec import ModelSpec
from ingest.acceptance.catalog import ModelCatalog
from ingest.acceptance.ports import IdempotencyKeys, JobQueue, RequestProducer, Waiter
from ingest.admission.load_watch import LoadWatch
from ingest.admission.overload import Overload
from ingest.admission.ratelimit import InflightLimiter, TenantLimiter
from ingest.admission.served import ServedHistory
from ingest.admission.shared_slots import SharedSlots
from ingest.edge.auth import Authenticator
from ingest.edge.readiness import Readiness
from results.tenants import Tenant

# A flex request's completion quote from its tenant, model and unanswered inputs (unix s;
# None: no worker serves it). Jobs quote (ingest/jobs/estimates.py), above this layer.
FlexQuote = Callable[[Tenant, ModelSpec, int], Awaitable[int | None]]


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
    quote_flex: FlexQuote | None = None  # services.py wires jobs' (decision 69)
    # Per model ref: the job items its backlog reads saw served (quotes, decision 69).
    served: dict[str, ServedHistory] = field(default_factory=dict)


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.gristmill
    return state
