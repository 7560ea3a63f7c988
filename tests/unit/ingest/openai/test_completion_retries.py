"""ingest/openai/completion_wire.py: what a retried completion (same Idempotency-Key) draws
and resumes."""

from __future__ import annotations

import pytest

from core.errors import InvalidInput
from core.models.causal_lm import SEED_MAX
from ingest.openai.completion_wire import keyed_seed, resume_from


def test_a_keyed_seed_repeats_for_the_same_tenant_and_key_only() -> None:
    s = keyed_seed("tenant-a", "order-17")
    assert s == keyed_seed("tenant-a", "order-17")
    assert s != keyed_seed("tenant-b", "order-17")
    assert s != keyed_seed("tenant-a", "order-18")
    # The separator keeps ("ab", "c") and ("a", "bc") apart.
    assert keyed_seed("ab", "c") != keyed_seed("a", "bc")
    seeds = [keyed_seed("t", f"k{i}") for i in range(1000)]
    assert all(0 <= x <= SEED_MAX for x in seeds)
    assert len(set(seeds)) == 1000


def test_a_retried_stream_starts_after_the_last_event_it_got() -> None:
    assert resume_from(None) == 0
    assert resume_from("-1") == 0
    assert resume_from("0") == 1
    assert resume_from("41") == 42


@pytest.mark.parametrize("bad", ["x", "1.5", "-2", str(1 << 20), ""])
def test_a_bad_last_event_id_is_refused_naming_the_header(bad: str) -> None:
    with pytest.raises(InvalidInput) as e:
        resume_from(bad)
    assert e.value.field == "Last-Event-ID"
