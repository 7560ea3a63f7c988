"""What the lifeline holds, as it travels to the watchdog and into dev.pids."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from gristmill.devservices.leftovers import RECORD_FILE, read_record
from gristmill.devservices.lifeline import Group, PgData, from_json, members, to_json, watch


def test_targets_round_trip_through_json() -> None:
    for target in (Group(1234, 5678, "API (port 8000)"), PgData("/x/data", "PostgreSQL")):
        assert from_json(json.loads(json.dumps(to_json(target)))) == target


def test_a_data_directory_without_a_server_has_no_members(tmp_path: Path) -> None:
    (tmp_path / "postmaster.pid").write_text("999999999\n")
    assert members(PgData(str(tmp_path), "PostgreSQL")) == []


def test_watchdog_stops_nothing_that_was_released() -> None:
    group = to_json(Group(2**22 + 1, 1, "gone"))
    lines = [
        json.dumps({"op": "hold", **group}).encode(),
        b"not json\n",
        json.dumps({"op": "release", **group}).encode(),
    ]
    term = signal.getsignal(signal.SIGTERM)
    try:
        assert watch(owner=1, lines=lines) == 0
    finally:  # the watchdog ignores SIGTERM once it stops things: not this test run
        signal.signal(signal.SIGTERM, term)


def test_record_names_owner_and_targets(tmp_path: Path) -> None:
    body = {
        "owner": {"pid": 4321, "started": 1},
        "targets": [to_json(Group(10, 20, "API (port 8000)")), to_json(PgData("/d", "PG"))],
    }
    (tmp_path / RECORD_FILE).write_text(json.dumps(body))
    owner, targets = read_record(tmp_path / RECORD_FILE)
    assert owner == 4321
    assert targets == [Group(10, 20, "API (port 8000)"), PgData("/d", "PG")]


def test_missing_or_torn_record_is_empty(tmp_path: Path) -> None:
    assert read_record(tmp_path / RECORD_FILE) == (None, [])
    (tmp_path / RECORD_FILE).write_text('{"owner": {"pid": 1}, "targets": [')
    assert read_record(tmp_path / RECORD_FILE) == (None, [])
