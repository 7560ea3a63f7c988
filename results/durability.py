"""The start-up durability check, for the API and the scheduler alike.

    problems = check_durability(settings)   # [] when Kafka and PostgreSQL keep their word

Reads the topics' replication and configuration from Kafka and PostgreSQL's commit
settings, and names each setting that falls short (core/durability.py holds the rules;
docs/decisions/0020-durability-checked-at-start-up.md says why). A process refuses to
start on any problem unless ``settings.allow_weak_durability`` is set: use
``refusal(settings)``, which is None when it may start.
"""

from __future__ import annotations

from sqlalchemy import Engine, text

from core.config import Settings
from core.durability import (
    ALLOW_HINT,
    checked_topics,
    kafka_problems,
    postgres_problems,
    topic_durability,
)
from results.db import make_engine

POSTGRES_SETTINGS = ("synchronous_commit", "fsync")


def postgres_durability(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return {
            name: str(conn.execute(text(f"SHOW {name}")).scalar()) for name in POSTGRES_SETTINGS
        }


def check_durability(settings: Settings, *, engine: Engine | None = None) -> list[str]:
    """Every durability setting of Kafka and PostgreSQL that falls short, as sentences
    naming it ([] when none does)."""
    topics = topic_durability(settings, checked_topics(settings))
    own = engine is None
    engine = engine or make_engine(settings.database_url, pool_size=1)
    try:
        pg = postgres_durability(engine)
    finally:
        if own:
            engine.dispose()
    return kafka_problems(topics) + postgres_problems(pg)


def refusal(settings: Settings, *, engine: Engine | None = None) -> str | None:
    """Why this process must not start (None: it may), for its error message."""
    if settings.allow_weak_durability:
        return None
    problems = check_durability(settings, engine=engine)
    if not problems:
        return None
    lines = "\n  ".join(problems)
    return f"refusing to start: durability below what Gristmill promises:\n  {lines}\n{ALLOW_HINT}"
