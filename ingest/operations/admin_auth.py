"""Operator routes (the dashboard, the model registry) accept only admin keys.

``gristmill tenants add-key NAME --admin`` issues one. The key is checked the way every
key is (ingest/edge/auth.py): its shape first, the bounded caches, one lookup at a time per
key through the small gate of concurrent lookups, so a flood of made-up keys on an
operator route costs no more than on any other. A revoked admin key stops at once on
every instance (the revocation NOTIFY; 2 s at most while that listener is down). A
missing or unknown key is 401, a tenant's ordinary key 403. Database errors map to
statuses in ingest/edge/http.py.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Header, Request

from ingest.acceptance.state import get_state


async def require_admin(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> str:
    """A FastAPI dependency: the actor an admin key names (for audit trails), or 401/403."""
    return await get_state(request).auth.admin(authorization)
