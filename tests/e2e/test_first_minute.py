"""The first minute after start-up behaves like the rest (issue 30, decision 40): a system
that has just started - a database of its own, topics of its own, one API process, a
scheduler with two `sim` workers - takes a large job and steady sync traffic at once,
and answers every sync request 200 while the job's intake and its first batches run.

Asserts outcomes (every request answered 200, every item done), never how fast.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from gristmill_client import Client

from gristmill.devservices.stack import Services, build_system
from results.db import libpq_url

pytest.importorskip("hdrh", reason="hdrhistogram is not installed (dev extra)")
from bench.steady.rig import write_jsonl
from bench.steady.traffic import TrafficSpec, run_traffic

RATE = 300  # sync requests/s: what one API process of this machine carries with room
SECONDS = 40
JOB_ITEMS = 40_000


def fresh_database(services: Services) -> str:
    """A database of its own on the session's server (fresh schema and partitions)."""
    name = f"first_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(libpq_url(services.database_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return services.database_url.rsplit("/", 1)[0] + f"/{name}"


@pytest.mark.slow
def test_a_fresh_system_answers_its_first_minute(services: Services, tmp_path: Path) -> None:
    fresh = Services(services.bootstrap, fresh_database(services))
    system = build_system(fresh, tmp_path)
    try:
        system.start_scheduler(workers=2, models="sim")
        system.url = system.start_api()
        system.wait_until_serving("sim")
        job_file = tmp_path / "job.jsonl"
        write_jsonl(job_file, JOB_ITEMS, "first-minute")
        job: dict[str, Any] = {}

        def submit() -> None:
            time.sleep(1.5)  # the traffic starts 2 s after its client process is spawned
            gm = Client(system.url, system.keys["free"], timeout_s=300)
            job.update(gm.submit_job("sim", job_file))

        submitter = threading.Thread(target=submit)
        submitter.start()
        spec = TrafficSpec(
            url=system.url,
            key=system.keys["enterprise"],
            rate=RATE,
            duration_s=SECONDS,
            tag=uuid.uuid4().hex[:6],
        )
        traffic = run_traffic(spec, processes=1)
        submitter.join()
        seconds = traffic.window(0, SECONDS)
        bad = {s: dict(c) for s, c in enumerate(traffic.seconds) if set(c) - {"200"}}
        assert seconds["200"] == RATE * SECONDS, f"not answered 200, by second: {bad}"
        assert traffic.wrong == 0
        done = Client(system.url, system.keys["free"], timeout_s=60).wait(
            job["job_id"], poll_s=1.0, timeout_s=300
        )
        assert done["counts"]["succeeded"] == JOB_ITEMS, done
    finally:
        system.close()
