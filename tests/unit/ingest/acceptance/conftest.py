"""The whole API on in-memory stand-ins (tests/unit/ingest/stubs.py), with a key."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from tests.unit.ingest.stubs import Stubs, stub_app


@pytest.fixture
def api() -> Iterator[tuple[TestClient, Stubs]]:
    app, stubs = stub_app()
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {stubs.key}"
        yield client, stubs
