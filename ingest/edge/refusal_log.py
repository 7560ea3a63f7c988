"""One log line per refused request, naming the caller's address: what an operator
greps to find a hostile caller (a flood of made-up keys, a tenant over its limits, bodies
too large or too slow).

The address is the one uvicorn put in the ASGI scope: the TCP peer, or the
``X-Forwarded-For`` address when the peer is one of ``GRISTMILL_FORWARDED_ALLOW_IPS``
(the ingress). A caller cannot plant an address here by sending the header itself.

A refusal costs the caller almost nothing, so the log could become the attack: lines are
drawn from a token bucket (``LogBudget``, pure, the clock passed in), and the next line
that is written says how many were left out. Decision 37.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.limits import shown

log = logging.getLogger(__name__)

# Refusals about the caller (who it is, how much it sends, how fast), not about a field of
# its input: 401 no or bad key, 403 not allowed, 408 body too slow, 413 body too large,
# 429 over its rate or concurrency limits. (Headers too large are refused by uvicorn
# itself, before the application sees the request.)
REFUSED_STATUSES = frozenset({401, 403, 408, 413, 429})
# Lines per second per API process, and the burst: about 150 bytes a line, so at most
# 1.5 KB/s (130 MB a day) of log per process under a sustained flood; the first second
# of a flood names its callers, the counts say how large it is (decision 37).
LINES_PER_S = 10.0
BURST_LINES = 20.0


class LogBudget:
    """A token bucket of log lines. Pure: ``take`` is given the time (seconds)."""

    def __init__(self, rate_per_s: float = LINES_PER_S, burst: float = BURST_LINES):
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._tokens = burst
        self._at: float | None = None
        self.left_out = 0  # refusals not logged since the last line written

    def take(self, now: float) -> int | None:
        """None: leave this one out (counted). Else: write it, and say how many before
        it were left out (returned, then reset)."""
        if self._at is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate_per_s)
        self._at = now
        if self._tokens < 1.0:
            self.left_out += 1
            return None
        self._tokens -= 1.0
        left_out, self.left_out = self.left_out, 0
        return left_out


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def refusal_line(scope: Scope, status: int, left_out: int) -> str:
    """``refused 401 POST '/v1/infer' from 203.0.113.7``; the path is the client's, so it
    is quoted and cut short (no forged lines)."""
    line = (
        f"refused {status} {scope.get('method', '?')} {shown(scope.get('path', ''))} "
        f"from {client_address(scope)}"
    )
    if left_out:
        line += f" ({left_out} earlier refusals not logged: over {LINES_PER_S:g} lines/s)"
    return line


class RefusalLog:
    """ASGI middleware: watches each response's status; logs the refused ones."""

    def __init__(
        self,
        app: ASGIApp,
        budget: LogBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.app = app
        self.budget = budget or LogBudget()
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def watching(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = int(message["status"])
                if status in REFUSED_STATUSES:
                    left_out = self.budget.take(self.clock())
                    if left_out is not None:
                        log.warning("%s", refusal_line(scope, status, left_out))
            await send(message)

        await self.app(scope, receive, watching)
