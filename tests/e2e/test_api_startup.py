"""The API, like the scheduler, refuses to start on durability it cannot keep."""

from __future__ import annotations

import pytest

from gristmill.devservices.stack import System


def test_an_api_without_the_allowance_refuses_to_start_naming_the_settings(
    system: System,
) -> None:
    # The test services are one broker and a throwaway database (fsync off).
    with pytest.raises(RuntimeError, match="API exited"):
        system.start_api("api-strict", env={"GRISTMILL_ALLOW_WEAK_DURABILITY": "false"})
    proc = system.procs.pop("api-strict")
    assert proc.returncode not in (0, None)
    log = (system.workdir / "api-strict.log").read_text()
    assert "refusing to start" in log and "GRISTMILL_ALLOW_WEAK_DURABILITY=true" in log
    assert "replication factor 1, needs >= 3" in log and "synchronous_commit=off" in log
