"""results/generation.py: a flush names the requests it wrote, under the NOTIFY cap."""

from __future__ import annotations

import uuid

from results.generation import wake_payloads


def test_every_id_is_named_once_in_payloads_under_the_cap() -> None:
    ids = [str(uuid.uuid4()) for _ in range(1000)]
    payloads = wake_payloads(ids)
    assert len(payloads) > 1 and all(len(p.encode()) <= 7000 for p in payloads)
    assert [i for p in payloads for i in p.split(",")] == ids
    assert wake_payloads([]) == []
