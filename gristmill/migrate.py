"""Bring the schema (Alembic) and the Kafka topics up to date."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from core.config import Settings
from results.db import sqlalchemy_url

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(settings: Settings) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(settings.database_url).replace("%", "%%"))
    return cfg


def migrate_database(settings: Settings, revision: str = "head") -> None:
    command.upgrade(alembic_config(settings), revision)
