"""Tenants and their API keys. Keys are shown once, at creation, and stored hashed."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from sqlalchemy import Connection, Select, select, update
from sqlalchemy.sql import func

from core.errors import InvalidInput, NotFound
from results.schema import TIERS, api_keys, tenants

KEY_PREFIX = "gm_"
_KEY_BYTES = 32  # of randomness: 43 URL-safe base64 characters after the prefix
# The only shape new_key() makes: anything else is refused before a lookup.
KEY_PATTERN = re.compile(r"gm_[A-Za-z0-9_-]{43}")
# Revocations and plan changes are announced here, so every API instance drops what it
# cached at once. Payload: "key:<key hash>" or "tenant:<tenant id>".
KEYS_CHANNEL = "gristmill_keys"


@dataclass(frozen=True)
class Tenant:
    id: str
    name: str
    tier: str
    # The plan: share inside the tier, and overrides of the tier's limits (None: default).
    weight: float = 1.0
    rate_rps: float | None = None
    burst: float | None = None
    job_items_per_s: float | None = None


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(_KEY_BYTES)


def well_formed(key: str) -> bool:
    return len(key) == 46 and KEY_PATTERN.fullmatch(key) is not None


def _announce(conn: Connection, payload: str) -> None:
    """Delivered to listeners when the surrounding transaction commits."""
    conn.execute(select(func.pg_notify(KEYS_CHANNEL, payload)))


def lookup_stmt(key: str) -> Select[tuple[str, str, str]]:
    """The one query that authenticates a request (run by ingest, async)."""
    return (
        select(
            tenants.c.id,
            tenants.c.name,
            tenants.c.tier,
            tenants.c.weight,
            tenants.c.rate_rps,
            tenants.c.burst,
            tenants.c.job_items_per_s,
            api_keys.c.admin,
            api_keys.c.prefix,
        )
        .join(api_keys, api_keys.c.tenant_id == tenants.c.id)
        .where(api_keys.c.key_hash == hash_key(key), api_keys.c.revoked_at.is_(None))
    )


def create_tenant(conn: Connection, name: str, tier: str) -> Tenant:
    if tier not in TIERS:
        raise InvalidInput(f"tier must be one of {', '.join(TIERS)}", field="tier")
    existing = conn.execute(select(tenants).where(tenants.c.name == name)).first()
    if existing is not None:
        raise InvalidInput(f"tenant {name!r} already exists", field="name")
    row = conn.execute(tenants.insert().values(name=name, tier=tier).returning(tenants.c.id)).one()
    return Tenant(row.id, name, tier)


def get_tenant(conn: Connection, name: str) -> Tenant:
    row = conn.execute(select(tenants).where(tenants.c.name == name)).first()
    if row is None:
        raise NotFound(f"no tenant named {name!r}")
    return Tenant(
        row.id, row.name, row.tier, row.weight, row.rate_rps, row.burst, row.job_items_per_s
    )


def issue_key(conn: Connection, tenant: Tenant, *, admin: bool = False) -> tuple[str, str]:
    """Returns (key id, the key in clear): the only moment the clear key exists.
    ``admin``: the key may also reach operator routes (ingest/operations/admin_auth.py)."""
    key = new_key()
    row = conn.execute(
        api_keys.insert()
        .values(tenant_id=tenant.id, key_hash=hash_key(key), prefix=key[:10], admin=admin)
        .returning(api_keys.c.id)
    ).one()
    return row.id, key


def list_keys(conn: Connection, tenant_name: str | None = None) -> list[dict[str, object]]:
    q = (
        select(
            tenants.c.name,
            tenants.c.tier,
            api_keys.c.id,
            api_keys.c.prefix,
            api_keys.c.created_at,
            api_keys.c.revoked_at,
            api_keys.c.admin,
        )
        .join(api_keys, api_keys.c.tenant_id == tenants.c.id)
        .order_by(tenants.c.name, api_keys.c.created_at)
    )
    if tenant_name is not None:
        q = q.where(tenants.c.name == tenant_name)
    return [dict(r._mapping) for r in conn.execute(q)]


def list_tenants(conn: Connection) -> list[Tenant]:
    return [
        Tenant(r.id, r.name, r.tier) for r in conn.execute(select(tenants).order_by(tenants.c.name))
    ]


def revoke_key(conn: Connection, key_id: str) -> None:
    """Revoke a key; API instances stop accepting it as soon as this commits."""
    row = conn.execute(
        update(api_keys)
        .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
        .values(revoked_at=func.now())
        .returning(api_keys.c.key_hash)
    ).first()
    if row is None:
        raise NotFound(f"no active key with id {key_id}")
    _announce(conn, f"key:{row.key_hash}")


def set_plan(
    conn: Connection,
    name: str,
    *,
    tier: str | None = None,
    weight: float | None = None,
    rate_rps: float | None = None,
    burst: float | None = None,
    job_items_per_s: float | None = None,
) -> Tenant:
    """Change a tenant's tier or plan; API instances pick it up when this commits."""
    values: dict[str, object] = {}
    if tier is not None:
        if tier not in TIERS:
            raise InvalidInput(f"tier must be one of {', '.join(TIERS)}", field="tier")
        values["tier"] = tier
    for key, v in (
        ("weight", weight),
        ("rate_rps", rate_rps),
        ("burst", burst),
        ("job_items_per_s", job_items_per_s),
    ):
        if v is not None:
            if v <= 0:
                raise InvalidInput(f"{key} must be positive", field=key)
            values[key] = v
    t = get_tenant(conn, name)
    if values:
        conn.execute(update(tenants).where(tenants.c.id == t.id).values(**values))
        _announce(conn, f"tenant:{t.id}")
    return get_tenant(conn, name)


def set_log_retention(conn: Connection, name: str, days: int | None) -> int | None:
    """Days the tenant's requests stay in the request log (None: the default,
    ``request_log_retention_days``); applied by the sweeper's next pass."""
    if days is not None and not 1 <= days <= 3650:
        raise InvalidInput("log retention must be 1..3650 days", field="log_retention_days")
    t = get_tenant(conn, name)
    conn.execute(update(tenants).where(tenants.c.id == t.id).values(log_retention_days=days))
    return days
