"""``/readyz`` from cached state: one background check per ``readyz_refresh_s``, so a
probe (or a flood of them) costs no database round trip."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from results.db import ping

log = logging.getLogger(__name__)


class Readiness:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        refresh_s: float,
        listening: Callable[[], bool],
        revocations: Callable[[], bool],
    ):
        self.engine = engine
        self.refresh_s = refresh_s
        self._listening = listening
        self._revocations = revocations
        self.database = False
        self.checked_at: float | None = None  # monotonic

    async def check_once(self) -> None:
        try:
            async with asyncio.timeout(self.refresh_s * 2):
                await ping(self.engine)
            self.database = True
        except Exception as exc:  # any failure means "not ready"
            if self.database:
                log.warning("readiness: the database check failed (%s)", type(exc).__name__)
            self.database = False
        self.checked_at = time.monotonic()

    async def run(self) -> None:
        while True:
            await self.check_once()
            await asyncio.sleep(self.refresh_s)

    def report(self, now: float) -> tuple[bool, dict[str, object]]:
        """(ready, checks) as of ``now`` (monotonic): a check older than three periods
        counts as failed (the checking task itself is stuck)."""
        fresh = self.checked_at is not None and now - self.checked_at <= 3 * self.refresh_s
        checks: dict[str, object] = {
            "database": self.database and fresh,
            "listener": self._listening(),
        }
        age = None if self.checked_at is None else round((now - self.checked_at) * 1000)
        ready = all(bool(v) for v in checks.values())
        # Not a readiness condition: without it keys are re-checked every 2 s instead.
        return ready, {**checks, "revocation_listener": self._revocations(), "age_ms": age}
