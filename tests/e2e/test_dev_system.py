"""The newcomer's path (issue 33): one ``gristmill dev`` as ``make dev`` starts it, with
its default models, and

* every example of the README run as printed against it (curl lines, the CLI's job
  commands, the OpenAI SDK and tritonclient snippets), from a shell that sourced its
  ``dev.env``; a code block the test does not know fails it, so a new example is run too;
* a real Prometheus scraping its ``/metrics`` counts every request sent, whichever of the
  API's processes answered (the multiprocess directory, as under ``gristmill api``);
* a scheduler killed while a completion streams is restarted, and says so, and the
  stream finishes with the same tokens; an API killed is restarted on its port while the
  scheduler keeps running; a worker killed is restarted by its scheduler, which says so
  in its log.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from gristmill.devservices import free_port
from tests.e2e.devrun import REPO, Dev
from tests.e2e.prom import MISSING, Prometheus, settled
from tests.e2e.waits import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

README = REPO / "README.md"
LM = "gristmill-lm"

# Every fenced block of the README, by a line it holds: run, or why not.
NOT_RUN = {
    "make dev    # installs everything": "make dev is the system under test; make test runs this",
    ".venv/bin/gristmill migrate": "operating a deployment: starts servers of its own on :8000",
    "gristmill host --models all-minilm-l6-v2": "a host of its own: test_gristmill_host.py",
    "make lint        # ruff": "the suite and its tools, not an example against the system",
    "gristmill chaos --rounds 20": "starts a 3-broker cluster of its own, minutes",
    "bench.loadtest --rate 200": "each benchmark starts a system of its own, minutes",
    '"request_id": "…"': "an answer, not a request",
    '"Prefer": "partial-results"': "a deadline cut to leave a call partial depends on the "
    "machine's speed: test_partial_embeddings.py runs this flow with the openai SDK, "
    "finding such a deadline first",
}


def readme_blocks() -> list[tuple[str, str]]:
    """(language, text) of every fenced code block, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def reason_not_run(text: str) -> str | None:
    return next((why for key, why in NOT_RUN.items() if key in text), None)


def commands(block: str) -> list[str]:
    """A shell block's commands: continuation lines joined, comments and blanks left out;
    ``a; b`` on one line stays one command (as printed)."""
    out, cur = [], ""
    for line in block.splitlines():
        cur += line
        if cur.endswith("\\"):
            cur = cur[:-1] + " "
            continue
        if cur.strip() and not cur.lstrip().startswith("#"):
            out.append(cur.strip())
        cur = ""
    return out


# ---- the system --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    """Where the examples run: ``.gristmill`` is the dev system's state directory and
    ``.venv`` this environment, as in a checkout after ``make dev``."""
    d = Path(tempfile.mkdtemp(prefix="gm-newcomer-"))
    d.chmod(0o755)  # PostgreSQL's unprivileged user enters its data directory below
    (d / ".venv").symlink_to(Path(sys.prefix))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def dev(home: Path) -> Iterator[Dev]:
    d = Dev(home / ".gristmill", free_port(), workers=2, models=None)  # make dev's models
    try:
        d.wait_ready()
        yield d
    finally:
        d.cleanup()


def shell_env(dev: Dev) -> dict[str, str]:
    """The environment of a shell that ran ``source .gristmill/dev.env``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRISTMILL_", "KAFKA_"))}
    env.pop("DATABASE_URL", None)
    return {**env, **dev.env(), "PYTHONPATH": str(REPO)}


def run_here(dev: Dev, home: Path, argv: list[str]) -> str:
    """``argv`` run where the examples run, in that shell's environment; its output."""
    r = subprocess.run(
        argv, cwd=home, env=shell_env(dev), capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, f"{argv}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def run_sh(dev: Dev, home: Path, command: str) -> str:
    return run_here(dev, home, ["bash", "-c", f"source .gristmill/dev.env && {command}"])


def infer(url: str, key: str, text: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/infer",
        json={"model": "sim", "input": text},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


def check_curl(command: str, out: str) -> None:
    """A curl example answered with success: 200/202 with -i, else a JSON body that is no
    error."""
    if " -i " in command:
        status = out.split("\r\n", 1)[0]
        assert re.match(r"HTTP/\S+ 20[02]", status), f"{command}\n{out[:500]}"
        return
    body = json.loads(out)
    assert "error" not in body, f"{command}\n{out[:500]}"


# ---- the README ------------------------------------------------------------------------
def test_every_readme_block_is_run_or_says_why_not() -> None:
    unknown = [
        text.splitlines()[0]
        for lang, text in readme_blocks()
        if reason_not_run(text) is None and lang not in ("sh", "python")
    ]
    assert not unknown, f"README blocks this test does not know: {unknown}"
    assert len([b for b in readme_blocks() if reason_not_run(b[1]) is None]) >= 7


def test_readme_shell_examples_as_printed(dev: Dev, home: Path) -> None:
    ran = 0
    job_id = ""
    for lang, text in readme_blocks():
        if lang != "sh" or reason_not_run(text) is not None:
            continue
        for command in commands(text):
            if "<job-id>" in command:
                assert job_id, "a command names <job-id> before a job was submitted"
                command = command.replace("<job-id>", job_id)
            out = run_sh(dev, home, command)
            ran += 1
            if command.startswith("curl"):
                check_curl(command, out)
            if (m := re.search(r"^job ([0-9a-f-]{36}): (\d+) items", out, re.M)) is not None:
                job_id = m.group(1)
                assert int(m.group(2)) == 2
                assert '"status": "completed"' in out, out  # --wait
            if command.startswith(".venv/bin/gristmill jobs results"):
                rows = [json.loads(x) for x in (home / "out.jsonl").read_text().splitlines()]
                assert [r["index"] for r in rows] == [0, 1], rows
                assert rows[1]["custom_id"] == "b" and rows[0]["status"] == "succeeded", rows
    assert job_id and ran >= 8, ran


RUNNER = """
import json, sys
blocks = json.load(open(sys.argv[1]))
ns = {}
for i, code in enumerate(blocks):
    print(f"--- block {i}", flush=True)
    exec(compile(code, f"README block {i}", "exec"), ns)
facts = {}
if "vectors" in ns:
    facts["vectors"] = [len(ns["vectors"]), len(ns["vectors"][0])]
if "b" in ns:
    facts["batch"] = [ns["b"].status, ns["b"].request_counts.total]
if "r" in ns and hasattr(ns["r"], "as_numpy"):
    facts["triton"] = list(ns["r"].as_numpy("embedding").shape)
print("FACTS " + json.dumps(facts))
"""


def run_python(dev: Dev, home: Path, blocks: list[str]) -> tuple[str, dict[str, Any]]:
    (home / "blocks.json").write_text(json.dumps(blocks))
    out = run_here(dev, home, [sys.executable, "-c", RUNNER, str(home / "blocks.json")])
    return out, json.loads(out.rsplit("FACTS ", 1)[1])


def python_blocks(containing: str) -> list[str]:
    blocks = [t for lang, t in readme_blocks() if lang == "python" and reason_not_run(t) is None]
    return [t for t in blocks if containing in t]


def test_readme_completions_with_the_openai_sdk(dev: Dev, home: Path) -> None:
    (block,) = python_blocks("completions.create")
    out, _ = run_python(dev, home, [block])
    streamed = out.split("--- block 0\n", 1)[1].rsplit("FACTS", 1)[0]
    assert streamed.strip(), f"the stream printed nothing: {out!r}"


def test_readme_embeddings_and_batches_with_the_openai_sdk(dev: Dev, home: Path) -> None:
    (embeddings,) = python_blocks("embeddings.create")
    (batches,) = python_blocks("batches.create")  # uses the embeddings block's client
    _, facts = run_python(dev, home, [embeddings, batches])
    assert facts["vectors"] == [2, 384]
    status, total = facts["batch"]
    assert total == 2 and status in ("validating", "in_progress", "completed"), facts


def test_readme_kserve_with_tritonclient(dev: Dev, home: Path) -> None:
    (block,) = python_blocks("tritonclient.http")
    _, facts = run_python(dev, home, [block])
    assert facts["triton"] == [2, 384]


def test_readme_kserve_over_grpc_with_tritonclient(dev: Dev, home: Path) -> None:
    (block,) = python_blocks("tritonclient.grpc")
    _, facts = run_python(dev, home, [block])
    assert facts["triton"] == [2, 384]


def test_every_python_example_is_run() -> None:
    runs = {"completions.create", "embeddings.create", "batches.create", "tritonclient"}
    for block in python_blocks(""):
        assert any(k in block for k in runs), f"a README example no test runs:\n{block}"


# ---- metrics ---------------------------------------------------------------------------
def test_prometheus_counts_every_request_whichever_process_answered(
    dev: Dev, tmp_path: Path
) -> None:
    if shutil.which("prometheus") is None:
        pytest.skip(MISSING)
    env = dev.env()
    url, key = env["GRISTMILL_URL"], env["GRISTMILL_API_KEY"]
    api = psutil.Process(dev.pid_of("api"))
    served_by = [c for c in api.children() if "spawn_main" in " ".join(c.cmdline())]
    assert len(served_by) == 2, "make dev runs two API processes"
    prom = Prometheus(tmp_path, {"gristmill-dev-api": url.removeprefix("http://")})
    try:
        query = 'sum(gristmill_api_responses_total{code="200"})'
        eventually(lambda: prom.query("up"), lambda r: r and r[0]["value"][1] == "1")
        before = settled(prom, query)
        n = 60

        with ThreadPoolExecutor(12) as pool:
            # A connection each: the kernel spreads them over both processes.
            codes = pool.map(lambda i: infer(url, key, f"counted {i}").status_code, range(n))
            assert list(codes) == [200] * n
        got = eventually(lambda: prom.value(query), lambda v: v == before + n)
        assert got == before + n, (before, got)
        time.sleep(3)
        assert prom.value(query) == before + n  # nothing counted twice
    finally:
        prom.stop()


# ---- supervision -----------------------------------------------------------------------
def test_a_killed_scheduler_is_restarted_and_the_stream_resumes(dev: Dev) -> None:
    env = dev.env()
    url, key = env["GRISTMILL_URL"], env["GRISTMILL_API_KEY"]
    prompt = "Kafka keeps"
    expected = httpx.post(
        f"{url}/v1/completions",
        json={"model": LM, "prompt": prompt, "max_tokens": 200, "temperature": 0},
        headers={"Authorization": f"Bearer {key}"},
        timeout=300,
    ).json()["choices"][0]["text"]
    old = dev.pid_of("scheduler")
    killed: list[int] = []

    def kill_once(text: str) -> None:
        if not killed and len(text) > 10:
            os.kill(old, signal.SIGKILL)
            killed.append(old)

    streamed = stream_completion(url, key, prompt, kill_once)
    assert killed, "the stream ended before the scheduler could be killed"
    assert streamed == expected
    assert "the scheduler exited with -9; restarting it" in dev.text()
    assert "the scheduler is running again" in dev.text()
    assert dev.pid_of("scheduler") != old
    # The API kept serving throughout, and the new scheduler serves sim too.
    r = infer(url, key, "after the restart")
    assert r.status_code == 200, r.text


def stream_completion(url: str, key: str, prompt: str, on_text: Any) -> str:
    """A streamed completion's text; ``on_text`` sees it grow, event by event."""
    text = ""
    with httpx.stream(
        "POST",
        f"{url}/v1/completions",
        json={
            "model": LM,
            "prompt": prompt,
            "max_tokens": 200,
            "temperature": 0,
            "stream": True,
        },
        headers={"Authorization": f"Bearer {key}"},
        timeout=300,
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            text += json.loads(line[6:])["choices"][0]["text"]
            on_text(text)
    return text


def test_a_killed_api_is_restarted_on_its_port(dev: Dev) -> None:
    env = dev.env()
    url = env["GRISTMILL_URL"]
    old = dev.pid_of("api")
    scheduler = dev.pid_of("scheduler")
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        try:
            # Ready, as an orchestrator would wait for it: PostgreSQL reachable and the
            # result listener up (alive alone is not yet answering in time).
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200 and (
                dev.pid_of("api") != old
            ):
                break
        except (httpx.HTTPError, AssertionError):
            pass
        assert time.monotonic() < deadline, dev.text()[-2000:]
        time.sleep(0.5)
    assert "the api exited with -9; restarting it" in dev.text()
    assert dev.pid_of("scheduler") == scheduler, "the scheduler kept running"
    r = infer(url, env["GRISTMILL_API_KEY"], "after the API's restart")
    assert r.status_code == 200, r.text


def test_a_killed_worker_is_restarted_by_its_scheduler(dev: Dev) -> None:
    env = dev.env()
    scheduler = psutil.Process(dev.pid_of("scheduler"))
    workers = [p for p in scheduler.children() if "workers" in p.cmdline()]
    assert len(workers) >= 3, "two batch workers and the generation worker"
    log = dev.state / "logs" / "scheduler.log"
    before = log.read_text(errors="replace").count("exited with -9; restarting")
    victim = workers[0]
    victim.kill()
    deadline = time.monotonic() + 60
    while log.read_text(errors="replace").count("exited with -9; restarting") == before:
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-2000:]
        time.sleep(0.5)
    # Replaced, and the system answers throughout: the scheduler itself never left.
    eventually(
        lambda: [p.pid for p in scheduler.children() if "workers" in p.cmdline()],
        lambda pids: len(pids) == len(workers) and victim.pid not in pids,
    )
    assert dev.pid_of("scheduler") == scheduler.pid
    r = infer(env["GRISTMILL_URL"], env["GRISTMILL_API_KEY"], "after a worker's restart")
    assert r.status_code == 200, r.text
