"""Hypothesis strategies for any JSON a client may send (property tests of parsers)."""

from __future__ import annotations

from hypothesis import strategies as st

# Integers orjson can write (a larger one could not reach a parser as JSON anyway).
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)
