"""ingest/edge/auth.py: the checks before a lookup, the bounded caches, revocations."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from core.config import Settings
from core.errors import Forbidden, Unauthorized
from ingest.edge.auth import Authenticator, KeyCache, bearer_key
from results.tenants import Tenant, hash_key, new_key, well_formed


def test_cache_evicts_the_least_recently_used_beyond_its_size() -> None:
    c: KeyCache[int] = KeyCache(3)
    for i, k in enumerate("abc"):
        c.put(k, i, expires_at=100)
    assert c.get("a", now=0) == 0  # a is now the most recent
    c.put("d", 3, expires_at=100)
    assert len(c) == 3
    assert c.get("b", now=0) is None  # b was the least recently used
    assert [c.get(k, now=0) for k in "acd"] == [0, 2, 3]


def test_cache_entries_expire_and_size_zero_keeps_nothing() -> None:
    c: KeyCache[str] = KeyCache(10)
    c.put("k", "v", expires_at=5.0)
    assert c.get("k", now=4.9) == "v"
    assert c.get("k", now=5.0) is None and len(c) == 0
    none: KeyCache[str] = KeyCache(0)
    none.put("k", "v", expires_at=5.0)
    assert none.get("k", now=0) is None


def test_a_flood_of_keys_stays_within_the_bound() -> None:
    c: KeyCache[bool] = KeyCache(1000)
    for i in range(50_000):
        c.put(f"gm_{i}", True, expires_at=10)
    assert len(c) == 1000


@pytest.mark.parametrize(
    "header,what",
    [
        (None, "missing"),
        ("", "missing"),
        ("Basic abc", "Bearer"),
        ("Bearer ", "Bearer"),
        ("Bearer gm_short", "malformed"),
        ("Bearer " + "gm_" + "a" * 44, "malformed"),
        ("Bearer " + "gm_" + "a" * 42 + "\x00", "malformed"),
        ("Bearer " + "gm_" + "a" * 42 + "!", "malformed"),
        ("Bearer " + "xx_" + "a" * 43, "malformed"),
        ("Bearer " + "x" * 100_000, "malformed"),
    ],
)
def test_bad_headers_are_refused_before_any_lookup(header: str | None, what: str) -> None:
    with pytest.raises(Unauthorized) as info:
        bearer_key(header)
    assert what in info.value.message


def test_every_key_new_key_makes_is_well_formed() -> None:
    keys = [new_key() for _ in range(2000)]
    assert all(well_formed(k) for k in keys)
    assert bearer_key(f"bearer  {keys[0]} ") == keys[0]


def authenticator(**overrides: Any) -> Authenticator:
    # No engine: these tests must never reach a lookup.
    return Authenticator(None, Settings(**overrides))  # type: ignore[arg-type]


def test_a_malformed_key_costs_no_lookup() -> None:
    auth = authenticator()
    with pytest.raises(Unauthorized):
        asyncio.run(auth.authenticate("Bearer gm_guess"))
    assert not auth._lookups and len(auth.missing) == 0


def test_cached_keys_answer_without_a_lookup_and_revocation_drops_them() -> None:
    auth = authenticator()
    a, b = new_key(), new_key()
    ta, tb = Tenant("t-a", "a", "free"), Tenant("t-b", "b", "paid")
    auth.found.put(a, (ta, hash_key(a), None), expires_at=1e12)
    auth.found.put(b, (tb, hash_key(b), None), expires_at=1e12)
    assert asyncio.run(auth.authenticate(f"Bearer {a}")) == ta
    assert auth.hear(f"key:{hash_key(a)}") == 1
    assert auth.found.get(a, now=0) is None and auth.found.get(b, now=0) is not None
    assert auth.hear("tenant:t-b") == 1 and len(auth.found) == 0


def test_admin_keys_are_checked_through_the_same_cache_without_a_lookup() -> None:
    auth = authenticator()  # no engine: a lookup would fail
    admin, plain, unknown = new_key(), new_key(), new_key()
    t = Tenant("t-a", "a", "enterprise")
    auth.found.put(admin, (t, hash_key(admin), "key gm_abc... of tenant a"), expires_at=1e12)
    auth.found.put(plain, (t, hash_key(plain), None), expires_at=1e12)
    auth.missing.put(unknown, True, expires_at=1e12)
    assert asyncio.run(auth.admin(f"Bearer {admin}")) == "key gm_abc... of tenant a"
    with pytest.raises(Forbidden):
        asyncio.run(auth.admin(f"Bearer {plain}"))
    for bad in (f"Bearer {unknown}", "Bearer gm_guess", None):
        with pytest.raises(Unauthorized):
            asyncio.run(auth.admin(bad))
    assert not auth._lookups
    auth.hear(f"key:{hash_key(admin)}")  # revoked: gone from the cache at once
    assert auth.found.get(admin, now=0) is None


def test_a_cached_miss_is_refused_without_a_lookup() -> None:
    auth = authenticator()
    k = new_key()
    auth.missing.put(k, True, expires_at=1e12)
    with pytest.raises(Unauthorized):
        asyncio.run(auth.authenticate(f"Bearer {k}"))


def test_keys_are_trusted_briefly_while_revocations_cannot_be_heard() -> None:
    auth = authenticator(auth_cache_s=10, auth_revocation_s=2)
    assert auth.trust_s() == 2  # not listening yet
    auth.listening = True
    assert auth.trust_s() == 10
    auth.found.put("k", (Tenant("t", "t", "free"), "h", None), expires_at=1e12)
    auth._lost()
    assert auth.trust_s() == 2 and len(auth.found) == 0


def test_an_unreadable_announcement_forgets_everything() -> None:
    auth = authenticator()
    auth.found.put("k", (Tenant("t", "t", "free"), "h", None), expires_at=1e12)
    before = auth._generation
    auth.hear("garbage")
    assert len(auth.found) == 0 and auth._generation == before + 1
