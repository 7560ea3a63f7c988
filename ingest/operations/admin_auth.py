"""Operator routes (the dashboard, the model registry) accept only admin keys.

``gristmill tenants add-key NAME --admin`` issues one. Unlike the request path
(ingest/edge/auth.py), the key is looked up on every call, without a cache: operator calls
are rare, and a revoked admin key must stop at once. A missing or unknown key is 401,
a tenant's ordinary key 403. Database errors map to statuses in ingest/edge/http.py.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Header, Request

from core.errors import Forbidden, Unauthorized
from ingest.acceptance.state import get_state
from ingest.edge.auth import bearer_key
from results.tenants import admin_lookup


async def require_admin(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> str:
    """A FastAPI dependency: the actor an admin key names (for audit trails), or 401/403."""
    row = await admin_lookup(get_state(request).engine, bearer_key(authorization))
    if row is None:
        raise Unauthorized("unknown or revoked API key")
    if not row.admin:
        raise Forbidden("this key has no admin scope; operator routes need an admin key")
    return f"key {row.prefix}... of tenant {row.name}"
