"""``/readyz`` from cached state: one background probe per ``readyz_refresh_s``, so a
probe (or a flood of them) costs no database round trip. Whether the database counts
as up is ``ingest/edge/db_health.py``'s judgement of every sign this instance has of it: a
probe that times out while commits still land is a slow database, not a down one."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from ingest.edge.db_health import DatabaseHealth, State
from results.db import ping

log = logging.getLogger(__name__)


class Readiness:
    # The checks that decide readiness (the report carries more, for operators).
    CONDITIONS = ("database", "listener")

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        refresh_s: float,
        listening: Callable[[], bool],
        revocations: Callable[[], bool],
        health: DatabaseHealth,
    ):
        self.engine = engine
        self.refresh_s = refresh_s
        self.timeout_s = refresh_s * 2  # one probe's wait for its answer
        self._listening = listening
        self._revocations = revocations
        self.health = health
        self.checked_at: float | None = None  # monotonic
        self._said: State = "ok"  # the state last logged

    async def check_once(self) -> None:
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout_s):
                await ping(self.engine)
            now = time.monotonic()
            self.health.answered(now, now - t0)
        except TimeoutError:
            self.health.timed_out(time.monotonic())
        except Exception as exc:  # refused, reset, an error: the database fails outright
            log.debug("readiness probe failed: %s", type(exc).__name__)
            self.health.failed(time.monotonic())
        self.checked_at = time.monotonic()
        self._log_change(self.checked_at)

    def _log_change(self, now: float) -> None:
        state = self.health.state(now)
        if state != self._said:
            log.warning("readiness: the database is %s (was %s)", state, self._said)
            self._said = state

    async def run(self) -> None:
        while True:
            await self.check_once()
            await asyncio.sleep(self.refresh_s)

    def report(self, now: float) -> tuple[bool, dict[str, object]]:
        """(ready, checks) as of ``now`` (monotonic). A probe older than three periods
        past its own timeout counts as failed (the probing task itself is stuck)."""
        fresh = (
            self.checked_at is not None
            and now - self.checked_at <= 3 * self.refresh_s + self.timeout_s
        )
        state = self.health.state(now)
        checks: dict[str, object] = {
            "database": state != "down" and fresh,
            "listener": self._listening(),
        }
        age = None if self.checked_at is None else round((now - self.checked_at) * 1000)
        ready = all(bool(v) for v in checks.values())
        latency = self.health.latency_ms
        return ready, {
            **checks,
            # Not readiness conditions: what the database is like now, and (without the
            # revocation listener) keys re-checked every 2 s instead.
            "database_state": state,
            "database_ms": None if latency is None else round(latency, 1),
            "revocation_listener": self._revocations(),
            "age_ms": age,
        }
