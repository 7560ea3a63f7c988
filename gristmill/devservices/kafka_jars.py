"""The Kafka jars the local brokers run from: ``docker/kafka/libs``, filled by Maven from
``docker/kafka/pom.xml`` the first time they are missing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from gristmill.devservices.served import LOG_TAIL_LINES


def default_repo_root() -> Path:
    """The checkout this package lives in (gristmill/devservices/kafka_jars.py -> repo root)."""
    return Path(__file__).resolve().parents[2]


def _has_kafka_jar(libs: Path) -> bool:
    return any(libs.glob("kafka_2.13-*.jar"))


def ensure_kafka_jars(repo_root: Path) -> Path:
    """Return ``docker/kafka/libs``, running Maven to fill it only if the Kafka jar is missing."""
    kafka_dir = repo_root / "docker" / "kafka"
    libs = kafka_dir / "libs"
    if _has_kafka_jar(libs):
        return libs
    if not (kafka_dir / "pom.xml").is_file():
        raise FileNotFoundError(f"{kafka_dir / 'pom.xml'} not found; cannot fetch Kafka jars")
    mvn = shutil.which("mvn")
    if mvn is None:
        raise FileNotFoundError("mvn not found on PATH; it is needed once to fetch the Kafka jars")
    result = subprocess.run(
        [
            mvn,
            "-q",
            "-B",
            "dependency:copy-dependencies",
            "-DoutputDirectory=libs",
            "-DincludeScope=runtime",
        ],
        cwd=kafka_dir,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0 or not _has_kafka_jar(libs):
        output = "\n".join((result.stdout + result.stderr).splitlines()[-LOG_TAIL_LINES:])
        raise RuntimeError(
            f"fetching Kafka jars with Maven failed (rc={result.returncode}):\n{output}"
        )
    return libs
