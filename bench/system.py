"""The system a benchmark drives: its own Kafka, PostgreSQL (or KAFKA_BOOTSTRAP /
DATABASE_URL when set), one API and one scheduler with `sim` workers, on loopback."""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from pathlib import Path

from gristmill.devservices.stack import System, build_system, local_services


def sim_system(
    stack: ExitStack, prefix: str, *, workers: int = 2, extra_env: dict[str, str] | None = None
) -> System:
    """Started and serving `sim`; torn down when ``stack`` closes."""
    work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
    services = stack.enter_context(local_services(work))
    system = build_system(services, work, extra_env=extra_env)
    stack.callback(system.close)
    system.start_scheduler(workers=workers, models="sim")
    system.url = system.start_api()
    system.wait_until_serving("sim")
    return system
