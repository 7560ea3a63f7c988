"""results/schema.py: the request-row type and the table agree."""

from __future__ import annotations

from core.vocab import RequestStatus
from results.schema import REQUEST_ROW_COLUMNS, requests
from results.store import _REQUEST_COLUMNS


def test_request_row_has_every_written_column_in_table_order() -> None:
    table = [c.name for c in requests.columns if c.name != "persisted_at"]
    assert list(REQUEST_ROW_COLUMNS) == table
    assert [c for c, _ in _REQUEST_COLUMNS] == table


def test_the_status_check_lists_every_request_status() -> None:
    named = {getattr(c, "name", ""): c for c in requests.constraints}
    check = named["requests_status_check"]
    assert all(f"'{s}'" in str(check.sqltext) for s in RequestStatus)  # type: ignore[attr-defined]
