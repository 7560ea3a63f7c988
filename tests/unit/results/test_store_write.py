"""The request log's write: which columns go once, and the statement that inserts them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from results.schema import REQUEST_ROW_COLUMNS
from results.store import column_arrays, insert_parameters, insert_statement

T0 = datetime(2026, 11, 27, 1, 0, tzinfo=UTC)


def row(i: int, **kw: Any) -> dict[str, Any]:
    r: dict[str, Any] = {c: None for c in REQUEST_ROW_COLUMNS}
    r.update(
        request_id=str(uuid.UUID(int=i)),
        tenant_id=str(uuid.UUID(int=1000)),
        priority="paid",
        model="sim",
        model_version="1",
        params={"salt": ""},
        input=f"text {i}",
        status="succeeded",
        output_vector=bytes([i % 256]) * 8,
        attempts=1,
        received_at=T0 + timedelta(microseconds=i),
        kafka_topic="t",
        kafka_partition=i % 3,
        kafka_offset=i,
    )
    r.update(kw)
    return r


def test_columns_every_row_shares_go_once_and_the_rest_as_arrays_in_order() -> None:
    rows = [row(i) for i in range(6)]
    sql, params = insert_parameters(column_arrays(rows))
    arrays = column_arrays(rows)
    shared = [
        c for c, col in zip(REQUEST_ROW_COLUMNS, arrays, strict=True) if col.count(col[0]) == 6
    ]
    assert "request_id" not in shared and {"tenant_id", "model", "status", "output"} <= set(shared)
    # Parameters: the shared values in column order, then one array per other column.
    n = len(shared)
    assert params[:n] == [arrays[REQUEST_ROW_COLUMNS.index(c)][0] for c in shared]
    varying = [c for c in REQUEST_ROW_COLUMNS if c not in shared]
    assert params[n:] == [arrays[REQUEST_ROW_COLUMNS.index(c)] for c in varying]
    assert sql.count("%b") == len(params)
    assert 'u."request_id"' in sql and 'u."tenant_id"' not in sql


def test_the_id_is_always_an_array_even_for_one_row() -> None:
    _, params = insert_parameters(column_arrays([row(1)]))
    assert all(isinstance(p, list) for p in params)  # one row: nothing is "shared"
    assert len(params) == len(REQUEST_ROW_COLUMNS)
    two = insert_parameters(column_arrays([row(1), row(1, request_id=str(uuid.UUID(int=2)))]))
    assert isinstance(two[1][-1], list) and two[1][-1] == [
        str(uuid.UUID(int=1)),
        str(uuid.UUID(int=2)),
    ]


def test_json_columns_compare_as_their_text_and_one_differing_row_keeps_an_array() -> None:
    rows = [row(i) for i in range(4)]
    rows[3]["params"] = {"salt": "x"}
    sql, params = insert_parameters(column_arrays(rows))
    assert 'u."params"' in sql
    assert ['{"salt":""}'] * 3 + ['{"salt":"x"}'] in params


def test_one_statement_per_set_of_shared_columns() -> None:
    a = insert_parameters(column_arrays([row(i) for i in range(3)]))[0]
    b = insert_parameters(column_arrays([row(i) for i in range(3, 9)]))[0]
    c = insert_parameters(column_arrays([row(i, tenant_id=str(uuid.uuid4())) for i in range(3)]))[0]
    assert a is b and a != c
    mask = tuple(False for _ in REQUEST_ROW_COLUMNS)
    assert insert_statement(mask).count("%b") == len(REQUEST_ROW_COLUMNS)
