"""Bring the schema (Alembic), the built-in model versions and the Kafka topics up to date."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from alembic import command
from alembic.config import Config

from core.config import Settings
from core.models.artifact import ArtifactError, artifact_sha256
from core.models.registry import Backend, VersionRecord, builtin_records
from results.db import make_engine, sqlalchemy_url

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
SEED_ACTOR = "gristmill migrate"


def alembic_config(settings: Settings) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(settings.database_url).replace("%", "%%"))
    return cfg


def migrate_database(settings: Settings, revision: str = "head") -> None:
    command.upgrade(alembic_config(settings), revision)
    if revision == "head":
        seed_models(settings)


def _with_digest(record: VersionRecord, settings: Settings) -> VersionRecord:
    """The packaged embedding weights get the sha256 workers will check, where this
    machine has them (an API-only image does not: then nothing is pinned)."""
    if record.backend != Backend.EMBEDDING or record.sha256:
        return record
    try:
        from core.models.text_tokenizer import model_files_dir

        return replace(record, sha256=artifact_sha256(model_files_dir(settings.embed_model_dir)))
    except (ImportError, ArtifactError, OSError) as exc:
        log.warning("no digest for %s here (%s): workers will not verify it", record.ref, exc)
        return record


def seed_models(settings: Settings) -> int:
    """Register the built-in versions as live where the registry has no version of
    them yet; returns how many were added."""
    from results import modelregistry

    added = 0
    with make_engine(settings.database_url, pool_size=1).begin() as conn:
        known = {(r.record.name) for r in modelregistry.list_versions(conn)}
        for record in builtin_records(settings):
            if record.name in known:
                continue
            if modelregistry.register(
                conn, _with_digest(record, settings), SEED_ACTOR, exist_ok=True
            ):
                added += 1
    return added
