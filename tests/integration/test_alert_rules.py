"""deploy/prometheus/alerts.yaml is valid (promtool check rules) and its rules fire
when they should and only then (promtool test rules, alerts_test.yaml beside it)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from gristmill.devservices.stack import REPO

RULES = REPO / "deploy" / "prometheus"
promtool = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    promtool is None, reason="promtool is missing (Debian: apt-get install prometheus)"
)


@needs_promtool
def test_alert_rules_are_valid() -> None:
    out = subprocess.run(
        [str(promtool), "check", "rules", str(RULES / "alerts.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


@needs_promtool
def test_alert_rules_fire_as_their_unit_tests_say() -> None:
    out = subprocess.run(
        [str(promtool), "test", "rules", "alerts_test.yaml"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=RULES,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
