"""results/partitions.py: the storage parameters a new partition is made with."""

from __future__ import annotations

import pytest

from results.partitions import REQUESTS_TOAST_TUPLE_TARGET, TABLE_OPTIONS, with_clause
from results.retention import PARTITIONED


def test_a_request_log_partition_keeps_rows_up_to_a_page_in_the_heap() -> None:
    assert with_clause("requests") == " WITH (toast_tuple_target = 8160)"


def test_the_target_is_within_what_postgresql_accepts() -> None:
    # toast_tuple_target is accepted from 128 bytes to TOAST_TUPLE_TARGET_MAIN (8 KB pages).
    assert 128 <= REQUESTS_TOAST_TUPLE_TARGET <= 8160


def test_tables_without_vectors_get_no_parameters() -> None:
    assert with_clause("refusals") == ""
    assert with_clause("answer_timeouts") == ""


def test_every_table_with_options_is_a_partitioned_one() -> None:
    assert set(TABLE_OPTIONS) <= set(PARTITIONED)


def test_an_option_name_that_is_not_a_plain_identifier_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(TABLE_OPTIONS, "requests", {"fillfactor = 10) --": 1})
    with pytest.raises(ValueError):
        with_clause("requests")
