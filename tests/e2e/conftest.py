"""Session-wide real services and a running Gristmill for the end-to-end tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from core.config import Settings
from gristmill.devservices.stack import Services, System, build_system, local_services
from gristmill.migrate import migrate_database
from results.db import libpq_url, make_engine


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/e2e/" in str(item.path):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    with local_services(tmp_path_factory.mktemp("services")) as s:
        yield s


@pytest.fixture(scope="session")
def system(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    workdir: Path = tmp_path_factory.mktemp("system")
    sys_ = build_system(services, workdir)
    try:
        sys_.start_scheduler()
        sys_.url = sys_.start_api()
        sys_.wait_until_serving("sim")
        yield sys_
    finally:
        sys_.close()


@pytest.fixture
def database(services: Services) -> Iterator[str]:
    """A fresh, empty database on the session's server; dropped afterwards."""
    name = f"gm_log_{uuid.uuid4().hex[:10]}"
    admin = libpq_url(
        make_url(services.database_url)
        .set(database="postgres")
        .render_as_string(hide_password=False)
    )
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = make_url(services.database_url).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def engine(database: str) -> Iterator[Engine]:
    """The fresh database migrated to the head, and an engine on it (a module may define
    an ``engine`` of its own, on the running system's database)."""
    migrate_database(Settings(database_url=database))
    eng = make_engine(database, pool_size=2)
    yield eng
    eng.dispose()


@pytest.fixture(scope="module")
def served(system: System) -> System:
    """The system once a worker serves the embedding model (it loads on CPU after sim)."""
    system.wait_until_serving("all-minilm-l6-v2", timeout_s=300)
    return system


@pytest.fixture(scope="module")
def client(served: System) -> Iterator[openai.OpenAI]:
    """The official openai SDK on the served system, as the paid tier, no retries."""
    c = openai.OpenAI(
        base_url=f"{served.url}/v1", api_key=served.keys["paid"], max_retries=0, timeout=60
    )
    yield c
    c.close()
