"""Background task of each API instance: announce itself, count its peers, and read
the schedulers' load reports for admission. Four times a second; never on a request path."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

from sqlalchemy.ext.asyncio import AsyncEngine

from core.config import Settings
from ingest import metrics
from ingest.admission.capacity import Admission
from ingest.admission.ratelimit import TenantLimiter
from ingest.admission.view import LoadView
from ingest.edge.db_health import DatabaseHealth
from results.load import (
    heartbeat_stmt,
    leave_stmt,
    live_instances_stmt,
    live_reports_stmt,
    process_id,
    publish_api_metrics_stmt,
    report_of,
)

log = logging.getLogger(__name__)


class LoadWatch:
    def __init__(self, engine: AsyncEngine, settings: Settings, limiter: TenantLimiter):
        self.engine = engine
        self.settings = settings
        self.limiter = limiter
        self.instance_id = process_id(
            settings.topic_prefix, f"{socket.gethostname()}-{os.getpid()}"
        )
        self.view: LoadView | None = None
        self.refreshes = 0
        # Told of each heartbeat's commit and its time (ingest/edge/db_health.py), if set.
        self.health: DatabaseHealth | None = None
        # What this instance offered and admitted lately, and which classes it refused.
        self.admission = Admission(
            margin_s=settings.deadline_margin_ms / 1000, max_buffered=settings.max_buffered
        )

    async def refresh(self, *, publish: bool = False) -> None:
        """``publish``: this process's metrics window for the dashboard goes with the
        heartbeat (once a second)."""
        stale = self.settings.load_report_stale_s
        async with self.engine.begin() as conn:
            if publish:
                window = metrics.window(time.time())
                await conn.execute(publish_api_metrics_stmt(self.instance_id, window))
            else:
                await conn.execute(heartbeat_stmt(self.instance_id))
            n = (
                await conn.execute(live_instances_stmt(stale, self.settings.topic_prefix))
            ).scalar_one()
            rows = (await conn.execute(live_reports_stmt(stale, self.settings.topic_prefix))).all()
        self.limiter.instances = max(1, int(n))
        view = LoadView.combine(report_of(r) for r in rows)
        view.as_of = time.monotonic() - max((float(r.age_s) for r in rows), default=0.0)
        self.view = view

    async def leave(self) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(leave_stmt(self.instance_id))

    async def run(self, interval_s: float = 0.25, publish_s: float = 1.0) -> None:
        every = max(1, round(publish_s / interval_s))
        while True:
            self.refreshes += 1
            t0 = time.monotonic()
            if self.health is not None:
                self.health.writing(t0)
            try:
                await self.refresh(publish=(self.refreshes - 1) % every == 0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep the last view; PostgreSQL may be restarting
                log.warning("load refresh failed: %s", exc)
                if self.health is not None:
                    self.health.write_failed()
            else:
                if self.health is not None:
                    now = time.monotonic()
                    self.health.committed(now, now - t0)
            await asyncio.sleep(interval_s)
