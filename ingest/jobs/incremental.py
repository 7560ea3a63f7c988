"""Incremental jobs (decision 61), the pure parts: what an item's content hash covers,
and whether a job may be the base of a new one.

An item's hash is sha256 over everything that decides its output: the tenant (results
are never shared across tenants, even by an accidental equal hash), the model and
version, the job's normalised params, and the item's input as canonical JSON. Its
custom id does not change the output and is left out: a re-submitted corpus may
renumber its items and still reuse them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime
from typing import Any

import orjson

from core.config import Settings
from core.errors import InvalidInput
from core.models.registry import spec_from_record
from results.reembed import Maker

_SCHEME = b"gristmill-item-v1\0"  # a different scheme later hashes differently


def scope_digest(tenant_id: str, model: str, version: str, params: dict[str, Any]) -> bytes:
    """What every item of one job shares, hashed once: the start of each item's hash."""
    head = orjson.dumps([tenant_id, model, version, params], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(_SCHEME + head).digest()


def canonical_input(value: Any, staged: str) -> str:
    """The input as canonical JSON: ``staged`` (its JSON as staged) unless key order can
    differ between two equal inputs, i.e. it holds an object."""
    if isinstance(value, str | int | float | bool) or value is None:
        return staged
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def item_hash(scope: bytes, canonical: str) -> bytes:
    """One item's content hash (32 bytes) from its job's ``scope_digest``."""
    return hashlib.sha256(scope + canonical.encode()).digest()  # one call: ~0.5 us an item


def hasher_for(model: str, version: str) -> Callable[[str, dict[str, Any]], Callable[[Any], bytes]]:
    """(tenant id, params) -> an item's hash from its input, as staging would compute it
    for a job of ``model@version`` (a re-embed's items, decision 68: results/reembed.py)."""

    def for_job(tenant_id: str, params: dict[str, Any]) -> Callable[[Any], bytes]:
        scope = scope_digest(tenant_id, model, version, params)
        return lambda value: item_hash(scope, canonical_input(value, orjson.dumps(value).decode()))

    return for_job


def reembed_maker(settings: Settings, model: str, version: str) -> Maker:
    """How the admin API and the CLI make a re-embed's job for ``model@version``
    (decision 68): the version's spec, staging's hash, the longest completion window (a
    whole corpus)."""
    return Maker(
        lambda r: spec_from_record(r, settings),
        hasher_for(model, version),
        settings.max_completion_window_s,
    )


def check_base(base: Any, model: str, version: str, field: str = "base_job_id") -> None:
    """400 unless ``base`` (the tenant's job row; another tenant's was already a 404)
    can lend its results to a job of ``model`` at ``version``: the same model and
    version, finished, its results not expired."""
    if (base.model, base.model_version) != (model, version):
        raise InvalidInput(
            f"base job {base.job_id} ran {base.model}@{base.model_version}; this job runs "
            f"{model}@{version}: an incremental job needs the same model and version",
            field=field,
        )
    if base.finished_at is None:
        raise InvalidInput(
            f"base job {base.job_id} is not finished; wait for it or cancel it",
            field=field,
        )
    if base.output_expired_at is not None:
        raise InvalidInput(
            f"base job {base.job_id}'s results expired at {_iso(base.output_expired_at)}",
            field=field,
        )


def _iso(t: datetime) -> str:
    return t.isoformat()
