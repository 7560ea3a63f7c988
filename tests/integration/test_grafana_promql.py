"""Every PromQL expression of deploy/grafana/gristmill.json parses: promtool checks
them as recording rules (Grafana's variables replaced by values they take)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gristmill.devservices.stack import REPO

promtool = shutil.which("promtool")


@pytest.mark.skipif(promtool is None, reason="promtool is missing (apt-get install prometheus)")
def test_grafana_expressions_parse(tmp_path: Path) -> None:
    dashboard = json.loads((REPO / "deploy" / "grafana" / "gristmill.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    rules = [
        {
            "record": f"grafana:expr_{i}",
            "expr": e.replace("$__rate_interval", "1m").replace("$model", ".*"),
        }
        for i, e in enumerate(exprs)
    ]
    path = tmp_path / "grafana_rules.yaml"
    path.write_text(json.dumps({"groups": [{"name": "grafana", "rules": rules}]}))
    out = subprocess.run(
        [str(promtool), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in out.stdout, out.stdout
