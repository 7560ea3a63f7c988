"""``gristmill ledger export``'s input: hostile values are refused by name (exit 2, no
traceback) before any database is asked; a period widens to whole minutes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gristmill.cli.ledger import whole_minutes
from gristmill.cli.main import app

T = str(uuid.uuid4())
runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--tenant", "acme"], "--tenant"),
        (["--tenant", "\x00"], "--tenant"),
        (["--tenant", "x" * 10_000], "--tenant"),
        (["--tenant", T, "--since", "yesterday"], "--since"),
        (["--tenant", T, "--since", "2026-02-30"], "--since"),
        (["--tenant", T, "--until", "2026-01-01T25:00"], "--until"),
        (["--tenant", T, "--since", "2026-01-02", "--until", "2026-01-01"], "--since"),
        (["--tenant", T, "--since", "2026-01-01", "--until", "2026-01-01"], "--since"),
        (["--tenant", T, "--until", "9999-12-31T23:59:59"], "--until"),
    ],
)
def test_hostile_input_is_refused_by_name(args: list[str], named: str) -> None:
    base = {"--since": "2026-01-01T00:00:00Z", "--until": "2026-01-02T00:00:00Z"}
    full = list(args)
    for k, v in base.items():
        if k not in full:
            full += [k, v]
    r = runner.invoke(
        app, ["ledger", "export", *full], env={"DATABASE_URL": "postgresql://x@127.0.0.1:1/none"}
    )
    assert r.exit_code == 2, r.output
    assert named in r.output and "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    if len(args[1]) > 100:
        assert len(r.output) < 2_000  # a huge value is not echoed whole


def test_an_unreachable_database_is_a_clear_error() -> None:
    r = runner.invoke(
        app,
        ["ledger", "export", "--tenant", T, "--since", "2026-01-01", "--until", "2026-01-02"],
        env={"DATABASE_URL": "postgresql://x:y@127.0.0.1:1/none"},
    )
    assert r.exit_code == 1 and "cannot read the ledger" in r.output


def test_a_period_widens_to_whole_minutes() -> None:
    a = datetime(2026, 1, 1, 10, 0, 30, tzinfo=UTC)
    b = datetime(2026, 1, 1, 10, 5, 0, tzinfo=UTC)
    c = datetime(2026, 1, 1, 10, 5, 0, 1, tzinfo=UTC)
    assert whole_minutes(a, b) == (a.replace(second=0), b)
    assert whole_minutes(a, c) == (a.replace(second=0), b.replace(minute=6))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_any_tenant_text_is_refused_or_taken(text: str) -> None:
    r = runner.invoke(
        app,
        ["ledger", "export", "--tenant", text, "--since", "x", "--until", "y"],
        env={"DATABASE_URL": "postgresql://x@127.0.0.1:1/none"},
    )
    assert r.exit_code == 2 and "Traceback" not in r.output
