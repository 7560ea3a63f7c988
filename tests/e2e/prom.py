"""A real Prometheus server for the e2e tests (Debian's ``prometheus`` package; ``make
test-tools`` installs it): scrapes the given targets every second, loads the alert rules,
answers PromQL."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from gristmill.devservices import free_port
from gristmill.devservices.stack import REPO

ALERTS = REPO / "deploy" / "prometheus" / "alerts.yaml"
MISSING = "the prometheus binary is missing (make test-tools, or apt-get install prometheus)"


class Prometheus:
    def __init__(self, workdir: Path, targets: dict[str, str]):
        binary = shutil.which("prometheus")
        assert binary is not None
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [target]}]}
                for job, target in targets.items()
            ],
        }
        cfg = workdir / "prometheus.yml"
        cfg.write_text(json.dumps(config))  # JSON is YAML
        self.log = (workdir / "prometheus.log").open("ab")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={cfg}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited; see {workdir / 'prometheus.log'}")
            time.sleep(0.2)
        raise RuntimeError("prometheus did not become ready")

    def query(self, promql: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=5)
        r.raise_for_status()
        body = r.json()
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def value(self, promql: str) -> float | None:
        """The query's single value (None: no series)."""
        res = self.query(promql)
        if not res:
            return None
        assert len(res) == 1, res
        return float(res[0]["value"][1])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def settled(prom: Prometheus, promql: str) -> float:
    """The query's value once it stopped changing for a few scrapes (0 with no series)."""
    last = prom.value(promql)
    for _ in range(60):
        time.sleep(2.5)
        now = prom.value(promql)
        if now == last:
            return now or 0.0
        last = now
    raise AssertionError(f"{promql} kept changing")
