"""Alembic environment: online migrations against the configured database."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from core.config import load_settings
from results.db import sqlalchemy_url
from results.schema import metadata

config = context.config


def run_migrations_online() -> None:
    url = config.get_main_option("sqlalchemy.url") or load_settings().database_url
    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=metadata)
        with context.begin_transaction():
            context.run_migrations()


run_migrations_online()
