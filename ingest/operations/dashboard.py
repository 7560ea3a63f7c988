"""The live dashboard: ``GET /dashboard`` (the page) and ``GET /dashboard/data`` (its
numbers, admin key only).

A browser cannot send a Bearer header when it navigates, so the page itself is static
and holds no data: it asks for an admin key, keeps it in ``sessionStorage`` (gone with
the tab), and fetches ``/dashboard/data`` with ``Authorization: Bearer`` once a second
(decision 33). The numbers are the whole deployment's: every live scheduler and API
process publishes a window of its own metrics beside its load report in PostgreSQL
(core/metrics_window.py), and this sums them (ingest/operations/dashboard_summary.py).
"""

from __future__ import annotations

import asyncio
import time
from importlib import resources
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from core.errors import Unavailable
from ingest.acceptance.state import get_state
from ingest.edge.json_response import ORJSONResponse
from ingest.operations.admin_auth import require_admin
from ingest.operations.dashboard_summary import Published, summarize
from ingest.operations.metrics import read_job_gauges
from results.load import live_metrics

STATIC = resources.files("ingest.operations") / "static"
# The page runs only its own script and talks only to this origin: an admin key typed
# into it cannot be read by injected script or sent elsewhere.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
# A query slower than this answers 503 (the page retries on its next tick).
DATA_TIMEOUT_S = 2.0

router = APIRouter(include_in_schema=False)


def _static(name: str, media_type: str) -> Response:
    return Response((STATIC / name).read_bytes(), media_type=media_type, headers=HEADERS)


@router.get("/dashboard")
async def page() -> Response:
    """The page's shell: no data and no key in it, so it needs none to load."""
    return _static("dashboard.html", "text/html; charset=utf-8")


@router.get("/dashboard/dashboard.js")
async def script() -> Response:
    return _static("dashboard.js", "text/javascript; charset=utf-8")


@router.get("/dashboard/dashboard.css")
async def style() -> Response:
    return _static("dashboard.css", "text/css; charset=utf-8")


@router.get("/dashboard/data")
async def data(request: Request, _actor: Annotated[str, Depends(require_admin)]) -> ORJSONResponse:
    """The deployment's numbers now (ingest/operations/dashboard_summary.py ``summarize``)."""
    state = get_state(request)
    s = state.settings
    try:
        async with asyncio.timeout(DATA_TIMEOUT_S):
            rows = await live_metrics(state.engine, s.load_report_stale_s, s.topic_prefix)
    except TimeoutError as exc:
        raise Unavailable("the metrics are not readable now", retry_after_s=1) from exc
    jobs = await read_job_gauges(state, DATA_TIMEOUT_S)
    published = [Published(r.kind, r.process, r.metrics) for r in rows]
    return ORJSONResponse(
        summarize(published, jobs, time.time()), headers={"Cache-Control": "no-store"}
    )
