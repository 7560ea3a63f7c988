"""The live dashboard against a running system (two uvicorn processes, a scheduler with
its metrics port off): known traffic sent, the page loaded in headless Chromium (Debian's
package) through the DevTools protocol, the key typed into its form, and the numbers it
renders compared with what was sent; no key is 401 and a tenant's key 403, on the data
endpoint and in the page.

``GRISTMILL_DASHBOARD_SCREENSHOT=docs/images/dashboard.png`` keeps the screenshot."""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from gristmill.devservices.stack import Services, System, build_system
from results.db import make_engine
from results.tenants import create_tenant, issue_key, set_plan
from tests.e2e.waits import eventually

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is missing (Debian: apt-get install chromium)"
)


# ---- a headless Chromium driven over the DevTools protocol ---------------------------------
class Browser:
    def __init__(self, workdir: Path):
        assert CHROMIUM is not None
        profile = workdir / "profile"
        profile.mkdir()
        self.log = (workdir / "chromium.log").open("ab")
        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless=new",
                "--no-sandbox",  # tests run as root in CI containers
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--remote-debugging-port=0",
                "--remote-allow-origins=*",
                f"--user-data-dir={profile}",
                "--window-size=1400,1200",
                "about:blank",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        port_file = profile / "DevToolsActivePort"
        deadline = time.time() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"chromium did not start; see {workdir / 'chromium.log'}")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        pages = eventually(
            lambda: [
                t
                for t in httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
                if t["type"] == "page"
            ],
            bool,
        )
        self.ws: ClientConnection = connect(pages[0]["webSocketDebuggerUrl"], max_size=None)
        self.ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        n = next(self.ids)
        self.ws.send(json.dumps({"id": n, "method": method, "params": params}))
        while True:  # events arrive in between: skip them
            msg = json.loads(self.ws.recv(timeout=30))
            if msg.get("id") == n:
                assert "error" not in msg, msg
                return dict(msg["result"])

    def js(self, expr: str) -> Any:
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in r, r
        return r["result"].get("value")

    def open(self, url: str) -> None:
        self.call("Page.enable")
        self.call("Page.navigate", url=url)
        eventually(lambda: self.js("document.readyState"), lambda s: s == "complete")

    def text(self, element_id: str) -> str:
        return str(self.js(f"document.getElementById({json.dumps(element_id)}).textContent"))

    def submit_key(self, key: str) -> None:
        self.js(
            f"document.getElementById('key').value = {json.dumps(key)};"
            "document.getElementById('login').requestSubmit(); true"
        )

    def screenshot(self, path: Path) -> None:
        height = self.js("document.documentElement.scrollHeight")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=1400,
            height=int(height),
            deviceScaleFactor=1,
            mobile=False,
        )
        time.sleep(0.5)  # one layout
        shot = self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# ---- the system ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dash_system(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    system = build_system(services, tmp_path_factory.mktemp("dashboard"))
    try:
        # No metrics port: the dashboard reads what the processes publish in PostgreSQL.
        system.start_scheduler(env={"GRISTMILL_METRICS_PORT": "0"})
        system.url = system.start_api(processes=2)
        system.wait_until_serving("sim")
        yield system
    finally:
        system.close()


@pytest.fixture(scope="module")
def admin_key(dash_system: System) -> str:
    with make_engine(dash_system.settings.database_url).begin() as conn:
        t = create_tenant(conn, f"ops-{uuid.uuid4().hex[:8]}", "enterprise")
        return issue_key(conn, t, admin=True)[1]


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    b = Browser(tmp_path)
    try:
        yield b
    finally:
        b.close()


def data(system: System, key: str) -> dict[str, Any]:
    r = httpx.get(
        f"{system.url}/dashboard/data", headers={"Authorization": f"Bearer {key}"}, timeout=10
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


def settled(system: System, key: str, read: Callable[[dict[str, Any]], Any]) -> Any:
    """The value once two publications (a second apart) agree."""
    last = read(data(system, key))
    for _ in range(30):
        time.sleep(1.5)
        now = read(data(system, key))
        if now == last:
            return now
        last = now
    raise AssertionError("the dashboard's numbers kept changing")


def infer(system: System, key: str, text: str) -> int:
    r = httpx.post(
        f"{system.url}/v1/infer",
        json={"model": "sim", "input": text},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    return r.status_code


def limited_key(system: System) -> str:
    with make_engine(system.settings.database_url).begin() as conn:
        t = create_tenant(conn, f"free-{uuid.uuid4().hex[:8]}", "free")
        set_plan(conn, t.name, rate_rps=0.5, burst=1)
        return issue_key(conn, t)[1]


def answered(d: dict[str, Any]) -> float:
    return float(d["throughput"]["answered"])


def refused_429(d: dict[str, Any]) -> float:
    return sum(r["total"] for r in d["refusals"] if (r["tier"], r["code"]) == ("free", "429"))


# ---- the tests ------------------------------------------------------------------------------
def test_the_data_needs_an_admin_key_the_page_does_not(dash_system: System) -> None:
    url = f"{dash_system.url}/dashboard/data"
    r = httpx.get(url, timeout=10)
    assert r.status_code == 401, r.text
    r = httpx.get(url, headers={"Authorization": "Bearer gm_not-a-key-at-all-0000"}, timeout=10)
    assert r.status_code == 401, r.text
    r = httpx.get(url, headers=dash_system.headers("paid"), timeout=10)
    assert r.status_code == 403, r.text
    assert "admin" in r.json()["error"]["message"]
    page = httpx.get(f"{dash_system.url}/dashboard", timeout=10)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert "/dashboard/dashboard.js" in page.text
    for asset in ("dashboard.js", "dashboard.css"):
        assert httpx.get(f"{dash_system.url}/dashboard/{asset}", timeout=10).status_code == 200


N = 30
JOB_ITEMS = 40_000  # about 20 s of the two sim workers' capacity (batches of 100 in 0.1 s)


def test_the_page_renders_the_traffic_sent(
    dash_system: System, admin_key: str, browser: Browser, tmp_path: Path
) -> None:
    system = dash_system
    before_answered = settled(system, admin_key, answered)
    before_refused = settled(system, admin_key, refused_429)

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda i: infer(system, system.keys["paid"], f"d{i}"), range(N)))
    assert codes == [200] * N
    free = limited_key(system)
    free_codes = [infer(system, free, f"f{i}") for i in range(6)]
    refused = free_codes.count(429)
    assert refused >= 2 and set(free_codes) <= {200, 429}, free_codes
    want_answered = before_answered + N + free_codes.count(200)
    want_refused = before_refused + refused

    # The page: a tenant's key is refused in it, then the admin key opens it.
    browser.open(f"{system.url}/dashboard")
    assert browser.js("document.getElementById('login').hidden") is False
    browser.submit_key(system.keys["paid"])
    error = eventually(lambda: browser.text("login-error"), lambda t: t.startswith("403"))
    assert error.startswith("403"), error
    assert browser.js("sessionStorage.getItem('gristmill.adminKey')") is None
    browser.submit_key(admin_key)
    shown = eventually(
        lambda: browser.text("answered-total"), lambda t: t == str(int(want_answered))
    )
    assert shown == str(int(want_answered)), (shown, want_answered)
    assert browser.js("document.getElementById('board').hidden") is False

    # Refusals by tier and reason, in the table as sent.
    def refusal_rows() -> list[list[str]]:
        return list(
            browser.js(
                "[...document.querySelectorAll('#refusals tbody tr')]"
                ".map(tr => [...tr.cells].map(td => td.textContent))"
            )
        )

    # (each API process publishes once a second: the last one's refusals may come later)
    want_row = ["free", "429", "tenant_rate"]
    rows = eventually(
        refusal_rows,
        lambda rs: any(r[:3] == want_row and r[4] == str(int(want_refused)) for r in rs),
    )
    row = next(r for r in rows if r[:3] == want_row)
    assert row[4] == str(int(want_refused)), rows

    # Latency by stage: sim computes a batch in 100 ms, so compute's p50 is in (100, 200] ms.
    def stage(name: str) -> list[str]:
        return list(
            browser.js(
                f"[...document.querySelector('#latency tr[data-stage=\"{name}\"]').cells]"
                ".map(td => td.textContent)"
            )
        )

    compute = stage("compute")
    assert 100 <= float(compute[2]) <= 200, compute
    for name in ("queue", "batch_wait", "persist", "respond", "total"):
        assert stage(name)[2] != "-", (name, stage(name))
    assert float(browser.text("answered-rate")) > 0  # within the 10 s window
    # Queues and lag by class, workers with their busy fraction.
    classes = browser.js(
        "[...document.querySelectorAll('#queues tbody tr')].map(tr => tr.cells[0].textContent)"
    )
    assert {"enterprise", "paid", "free", "jobs"} <= set(classes), classes
    workers = browser.js("document.querySelectorAll('#workers tbody tr').length")
    assert workers == 2
    assert "2 ready" in browser.text("worker-count")
    assert browser.text("status").startswith("1 scheduler(s), 2 API process(es)")

    # Live: more traffic while the page is open shows without a reload.
    stop = threading.Event()

    def steady() -> None:
        i = 0
        while not stop.is_set():
            infer(system, system.keys["paid"], f"s{i}")
            infer(system, free, f"sf{i}")
            i += 1
            time.sleep(0.05)

    # A job to show running: its items fill the capacity sync traffic leaves.
    items = [{"input": f"j{i}"} for i in range(JOB_ITEMS)]
    r = httpx.post(
        f"{system.url}/v1/jobs",
        json={"model": "sim", "items": items},
        headers=system.headers("paid"),
        timeout=120,
    )
    assert r.status_code == 202, r.text
    with ThreadPoolExecutor(3) as pool:
        for _ in range(3):
            pool.submit(steady)
        try:
            running = eventually(lambda: int(browser.text("jobs-running")), lambda n: n >= 1)
            assert running >= 1  # the database is the session's: other tests' jobs count too
            job_rate = eventually(
                lambda: browser.js(
                    "document.querySelector('#latency-jobs tbody tr').cells[1].textContent"
                ),
                lambda t: t not in ("-", "0.0"),
            )
            assert float(job_rate) > 0  # job items' stages, apart from the sync requests'
            grown = eventually(
                lambda: int(browser.text("answered-total")),
                lambda n: n >= want_answered + 20,
            )
            assert grown >= want_answered + 20
            t1 = browser.js("document.body.dataset.updated")
            time.sleep(2.5)
            assert browser.js("document.body.dataset.updated") != t1  # polled again
            time.sleep(5)  # a window full of traffic for the picture, the job still running
            shot = tmp_path / "dashboard.png"
            browser.screenshot(shot)
        finally:
            stop.set()
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    keep = os.environ.get("GRISTMILL_DASHBOARD_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)

    # Forgetting the key shows the form again.
    browser.js("document.getElementById('forget').click(); true")
    assert browser.js("document.getElementById('login').hidden") is False
    assert browser.js("sessionStorage.getItem('gristmill.adminKey')") is None
