"""Check on the GPU machine that what the bundle carried works, before a long run:
the trimmed Java runtime starts a broker, Debian's PostgreSQL starts and takes the
migrations, every module of the service imports, CUDA and NVML see the GPUs.

    bash bench/gpuhost/device.sh python3 -m bench.gpuhost.check
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

MODULES = (
    "confluent_kafka",
    "fastapi",
    "uvicorn",
    "uvloop",
    "httptools",
    "sqlalchemy",
    "psycopg",
    "alembic",
    "pydantic_settings",
    "orjson",
    "aiohttp",
    "hdrh.histogram",
    "pynvml",
    "ingest.main",
    "scheduler.runtime.service",
    "workers.process",
    "gristmill.cli.main",
)


def main() -> int:
    report: dict[str, object] = {"cores": len(os.sched_getaffinity(0))}
    failed = []
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # report every missing piece at once
            failed.append(f"{name}: {exc!r}")
    report["imports_failed"] = failed
    import torch

    report["cuda"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    from gristmill.devservices import KafkaCluster, PostgresServer

    root = Path(os.environ.get("GMHOST_ROOT", "/opt/gmhost"))
    work = Path(tempfile.mkdtemp(prefix="gmcheck-"))
    work.chmod(0o755)
    t0 = time.time()
    kafka = KafkaCluster(
        work / "kafka", libs_dir=root / "kafka-libs", java=str(root / "jre/bin/java")
    )
    pg = PostgresServer(work / "pg", fast=False)
    try:
        kafka.start(timeout_s=90)
        report["kafka_s"] = round(time.time() - t0, 1)
        pg.start()
        from core.config import settings_from_env
        from gristmill.migrate import migrate_database

        env = {**os.environ, "DATABASE_URL": pg.url, "KAFKA_BOOTSTRAP": kafka.bootstrap}
        migrate_database(settings_from_env(env))
        report["postgres_and_migrations_s"] = round(time.time() - t0, 1)
    finally:
        kafka.stop()
        pg.stop()
    print(json.dumps(report, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
