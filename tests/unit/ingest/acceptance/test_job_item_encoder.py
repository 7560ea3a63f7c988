"""A job item's message bytes from ``JobItems.encoder`` are exactly the message's own."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from core.messages import RequestMessage
from ingest.acceptance.message import JobItems

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=6,
)


def job(**over: object) -> JobItems:
    fields: dict[str, object] = {
        "job_id": "01938a6e-0000-7000-8000-000000000001",
        "tenant_id": "tenant-a",
        "model": "all-minilm-l6-v2",
        "version": "1",
        "params": {"normalize": True},
        "deadline": 1_900_000_000.25,
        "received_at": 1_800_000_000.5,
        "weight": 1.0,
    }
    fields.update(over)
    return JobItems(**fields)  # type: ignore[arg-type]


@settings(max_examples=200)
@given(
    tenant=st.text(min_size=1, max_size=30),
    params=st.dictionaries(st.text(max_size=10), json_values, max_size=4),
    weight=st.floats(0.001, 1e6, allow_nan=False),
    item=json_values,
    index=st.integers(0, 10**9),
    attempt=st.integers(0, 1000),
    as_text=st.booleans(),
)
def test_the_bytes_are_the_message_s(
    tenant: str, params: dict, weight: float, item: object, index: int, attempt: int, as_text: bool
) -> None:
    items = job(tenant_id=tenant, params=params, weight=weight)
    value: str | bytes = orjson.dumps(item)
    if as_text:
        value = value.decode()
    rid = "01938a6e-1234-7000-8000-00000000abcd"
    got = items.encoder()(index, value, rid, attempt)
    assert got == items.message(index, value, rid, attempt).encode()
    back = RequestMessage.decode(got)
    assert (back.input, back.item_index, back.job_attempt) == (item, index, attempt)


def test_a_shared_field_holding_a_marker_still_encodes_right() -> None:
    for params in ({"x": "@@input@@"}, {"x": "@@request_id@@"}, {"n": 987654321987654}):
        items = job(params=params)
        got = items.encoder()(7, b'"text"', "rid-1", 2)
        assert got == items.message(7, b'"text"', "rid-1", 2).encode()
    items = job(weight=1987654321987654.0)
    assert items.encoder()(7, b'"t"', "r", 2) == items.message(7, b'"t"', "r", 2).encode()
