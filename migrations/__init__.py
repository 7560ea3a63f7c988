"""Alembic migrations: the only way the schema changes."""
