"""How many of one scheduler's workers can serve a version, as the scheduler reports it
(scheduler/core/model_control.py) and results/modelregistry.py stores it for the API."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Readiness:
    """One scheduler's workers for one version (or, read back, every scheduler's summed;
    routing, ingest/acceptance/routing.py, needs only the counts)."""

    name: str = ""
    version: str = ""
    ready: int = 0
    loading: int = 0
    unavailable: int = 0
    failed: int = 0
    error: str | None = None
    retry_after_s: float | None = None
