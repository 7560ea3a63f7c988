"""Session-wide real services and a running Gristmill for the end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gristmill.devservices.stack import Services, System, build_system, local_services


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
