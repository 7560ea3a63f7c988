"""A job's items are put in Kafka by a child process of the API process that took the
upload, at a lower CPU priority (decision 74); the job completes as before, and the child
does not outlive its API process when that is killed outright."""

from __future__ import annotations

import os
import signal

import httpx
import orjson
import psutil

from gristmill.devservices.stack import System
from ingest.jobs.publish_process import NICE
from tests.e2e.test_jobs import all_results, wait_done
from tests.e2e.waits import eventually

ITEMS = 3000


def publishers(api: int) -> list[psutil.Process]:
    """The API process's publishing children (not multiprocessing's resource tracker)."""
    kids = psutil.Process(api).children()
    return [k for k in kids if "resource_tracker" not in " ".join(k.cmdline())]


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_child_process_publishes_and_dies_with_its_api(system: System) -> None:
    url = system.start_api("api-publish")
    api = system.procs["api-publish"].pid
    assert publishers(api) == []  # started by the first job, not before
    body = b"".join(orjson.dumps({"input": f"line {i}"}) + b"\n" for i in range(ITEMS))
    r = httpx.post(
        f"{url}/v1/jobs?model=sim",
        content=body,
        headers={**system.headers(), "Content-Type": "application/x-ndjson"},
        timeout=120,
    )
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    done = wait_done(system, job_id)
    assert done["status"] == "completed" and done["counts"]["succeeded"] == ITEMS
    assert [x["index"] for x in all_results(system, job_id)] == list(range(ITEMS))

    (child,) = publishers(api)
    assert child.nice() == os.nice(0) + NICE, "publishing runs below the API's priority"
    log = (system.workdir / "api-publish.log").read_text()
    assert "publishing here" not in log, "the publish fell back to the API process"

    os.kill(api, signal.SIGKILL)
    assert eventually(lambda: alive(child), lambda a: not a, 15) is False, (
        "the publishing child outlived its API"
    )
    system.stop("api-publish")
