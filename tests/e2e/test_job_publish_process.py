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
CHILD = {"GRISTMILL_JOB_PUBLISH_PROCESS": "true"}  # off by default until measured


def publishers(api: int) -> list[psutil.Process]:
    """The API process's publishing children (not multiprocessing's resource tracker)."""
    kids = psutil.Process(api).children()
    return [k for k in kids if "resource_tracker" not in " ".join(k.cmdline())]


def upload(system: System, url: str, n: int, tag: str) -> str:
    """A JSONL job of ``n`` items for ``sim``, on a new connection; its id."""
    body = b"".join(orjson.dumps({"input": f"{tag} {i}"}) + b"\n" for i in range(n))
    r = httpx.post(
        f"{url}/v1/jobs?model=sim",
        content=body,
        headers={**system.headers(), "Content-Type": "application/x-ndjson"},
        timeout=120,
    )
    assert r.status_code == 202, r.text
    return str(r.json()["job_id"])


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_child_process_publishes_and_dies_with_its_api(system: System) -> None:
    url = system.start_api("api-publish", env=CHILD)
    api = system.procs["api-publish"].pid
    assert publishers(api) == []  # started by the first job, not before
    job_id = upload(system, url, ITEMS, "line")
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


def test_each_process_of_gristmill_api_publishes_from_a_child(system: System) -> None:
    """`gristmill api --workers 2`: its processes (children of the launcher) may have
    children of their own, and a job sent to either is published by one."""
    url = system.start_api("api-publish-2", processes=2, cli=True, env=CHILD)
    # Each on a connection of its own, so both processes likely take one.
    jobs = [upload(system, url, 500, "two") for _ in range(4)]
    for job_id in jobs:
        assert wait_done(system, job_id)["counts"]["succeeded"] == 500
    launcher = psutil.Process(system.procs["api-publish-2"].pid)
    children = [p for proc in launcher.children() for p in publishers(proc.pid)]
    assert 1 <= len(children) <= 2 and all(c.nice() == os.nice(0) + NICE for c in children)
    log = (system.workdir / "api-publish-2.log").read_text()
    assert "publishing here" not in log and "Traceback" not in log, log[-2000:]
    system.stop("api-publish-2")
