"""The images' lock files (docker/requirements/*.txt, written by docker/image/lock.py)
hold every dependency pyproject.toml names: the images install them with --no-deps, so a
dependency added to pyproject.toml and not relocked is missing from the image (its
processes fail at import)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
OWN = {"gristmill", "gristmill-client"}  # built from this repository, not locked


def locked(variant: str) -> dict[str, str]:
    """Package name -> pinned version in docker/requirements/<variant>.txt."""
    pins = {}
    for line in (REPO / "docker" / "requirements" / f"{variant}.txt").read_text().splitlines():
        if "==" in line and not line.startswith(("#", " ")):
            name, version = line.split(" ")[0].split("==")
            pins[canonicalize_name(name)] = version
    return pins


def required(*extras: str) -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return [r for r in reqs if canonicalize_name(r.name) not in OWN]


@pytest.mark.parametrize(("variant", "extras"), [("cpu", ()), ("cuda", ("embed",))])
def test_every_dependency_is_locked_at_a_version_it_allows(
    variant: str, extras: tuple[str, ...]
) -> None:
    pins = locked(variant)
    missing = [str(r) for r in required(*extras) if canonicalize_name(r.name) not in pins]
    assert not missing, f"not in docker/requirements/{variant}.txt (run docker/image/lock.py)"
    refused = [
        f"{r} (locked {pins[canonicalize_name(r.name)]})"
        for r in required(*extras)
        if not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)
    ]
    assert not refused, refused


def test_the_extras_of_a_dependency_are_locked_too() -> None:
    # uvicorn[standard] brings uvloop and httptools; sqlalchemy[asyncio] greenlet.
    pins = locked("cpu")
    assert {"uvloop", "httptools", "greenlet"} <= set(pins)
