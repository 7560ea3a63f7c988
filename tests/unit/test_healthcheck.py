"""The image's HEALTHCHECK (docker/healthcheck.py) against a real HTTP endpoint: the
ledger is healthy while its metrics server answers (docker/compose.yaml's ledger)."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path
from types import ModuleType

import pytest
from prometheus_client import CollectorRegistry, start_http_server

SCRIPT = Path(__file__).resolve().parents[2] / "docker/healthcheck.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gristmill_healthcheck", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


LEDGER = ["tini", "--", "/opt/venv/bin/gristmill", "ledger", "run"]


def test_a_ledger_whose_metrics_answer_is_healthy(monkeypatch: pytest.MonkeyPatch) -> None:
    hc = load()
    port = free_port()
    monkeypatch.setenv("GRISTMILL_LEDGER_METRICS_PORT", str(port))
    server, thread = start_http_server(port, "127.0.0.1", registry=CollectorRegistry())
    try:
        assert hc.check(LEDGER) == 0
    finally:
        server.shutdown()
        thread.join(5)


def test_a_ledger_not_answering_is_unhealthy_and_says_where(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hc = load()
    port = free_port()
    monkeypatch.setenv("GRISTMILL_LEDGER_METRICS_PORT", str(port))
    assert hc.check(LEDGER) == 1
    assert f"ledger not answering at http://127.0.0.1:{port}/metrics" in capsys.readouterr().err


def test_a_ledger_without_a_metrics_port_is_healthy_while_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GRISTMILL_LEDGER_METRICS_PORT", "0")
    assert load().check(LEDGER) == 0


def test_the_api_is_still_probed_on_its_port(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    argv = ["tini", "--", "gristmill", "api", "--port", str(port)]
    assert load().check(argv) == 1
    assert f"api not answering at http://127.0.0.1:{port}/healthz" in capsys.readouterr().err
