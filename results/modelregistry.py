"""The live model registry: schedulers announce what their workers serve.

Ingest resolves a request's model against it, so a model is routable exactly
when some scheduler has a live worker for it (``last_seen_at`` is a heartbeat).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Select, func, select
from sqlalchemy.dialects.postgresql import insert

from results.schema import models

# A model not announced for this long is considered to have no live worker.
STALE_AFTER_S = 30.0


def announce(
    conn: Connection, name: str, version: str, max_batch_size: int, profile_ms: dict[int, float]
) -> None:
    stmt = insert(models).values(
        name=name,
        version=version,
        max_batch_size=max_batch_size,
        profile_ms={str(k): v for k, v in profile_ms.items()},
    )
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["name", "version"],
            set_={
                "max_batch_size": stmt.excluded.max_batch_size,
                "profile_ms": stmt.excluded.profile_ms,
                "last_seen_at": func.now(),
            },
        )
    )


def live_stmt() -> Select[Any]:
    """All models with whether each has been announced recently."""
    fresh = models.c.last_seen_at > func.now() - func.make_interval(0, 0, 0, 0, 0, 0, STALE_AFTER_S)
    return select(models.c.name, models.c.version, models.c.max_batch_size, fresh.label("live"))
