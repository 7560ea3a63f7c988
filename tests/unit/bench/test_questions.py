"""The analysts' questions the growth benchmark measures are the ones docs/analysts.md
gives, word for word."""

from __future__ import annotations

from pathlib import Path

from bench.store.questions import QUESTIONS, as_documented

DOC = Path(__file__).resolve().parents[3] / "docs" / "analysts.md"


def test_every_measured_query_is_documented_as_it_is_measured() -> None:
    text = DOC.read_text()
    missing = [q.key for q in QUESTIONS if as_documented(q.sql) not in text]
    assert missing == []


def test_placeholders_are_written_the_psql_way() -> None:
    assert as_documented("WHERE a = %(tenant)s AND b < %(hour_end)s") == (
        "WHERE a = :tenant AND b < :hour_end"
    )
