"""Time-ordered request ids (core/ids.py, decision 72)."""

from __future__ import annotations

import uuid

from core.ids import derived_uuid7, indexed_uuid7, time_ordered, uuid7


def test_a_v7_id_is_a_canonical_rfc_uuid_of_version_7() -> None:
    rid = uuid7()
    u = uuid.UUID(rid)
    assert str(u) == rid
    assert u.version == 7
    assert u.variant == uuid.RFC_4122


def test_its_first_48_bits_are_the_time_it_was_given() -> None:
    ms = 1_796_000_123_456
    assert uuid.UUID(uuid7(ms)).int >> 80 == ms


def test_ids_sort_by_their_time_whatever_their_random_bits() -> None:
    ids = [uuid7(1_796_000_000_000 + k) for k in range(0, 5000, 7)]
    assert sorted(ids) == ids
    assert sorted(uuid.UUID(i) for i in ids) == [uuid.UUID(i) for i in ids]


def test_ids_of_the_same_millisecond_differ() -> None:
    ids = {uuid7(1_796_000_000_000) for _ in range(10_000)}
    assert len(ids) == 10_000


def test_only_v7_ids_count_as_time_ordered() -> None:
    assert time_ordered(uuid7())
    assert not time_ordered(str(uuid.uuid4()))
    assert not time_ordered(str(uuid.uuid5(uuid.uuid4(), "1")))
    assert not time_ordered("not an id")


def test_a_derived_id_keeps_the_time_and_is_reproducible() -> None:
    first = uuid7(1_796_000_000_000)
    a, b = derived_uuid7(first, "1"), derived_uuid7(first, "2")
    assert a == derived_uuid7(first, "1")
    assert a != b
    assert a != first
    for d in (a, b):
        u = uuid.UUID(d)
        assert u.version == 7 and u.variant == uuid.RFC_4122
        assert u.int >> 80 == 1_796_000_000_000


def test_indexed_ids_sort_by_index_and_differ_by_salt() -> None:
    first = uuid7(1_796_000_000_000)
    a, b = indexed_uuid7(first, "0"), indexed_uuid7(first, "1")
    idx = [0, 1, 2, 10, 4095, 4096, 10**6, 2**20 - 1, 2**20, 2**20 + 1, 2**32 - 1]
    ids = [a(i) for i in idx]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert [a(i) for i in idx] == ids  # reproducible
    assert all(a(i) != b(i) for i in idx)
    for i in ids:
        u = uuid.UUID(i)
        assert str(u) == i and u.version == 7 and u.variant == uuid.RFC_4122
        assert u.int >> 80 == 1_796_000_000_000


def test_two_jobs_of_one_millisecond_name_different_items() -> None:
    one, two = uuid7(1_796_000_000_000), uuid7(1_796_000_000_000)
    x, y = indexed_uuid7(one, "0"), indexed_uuid7(two, "0")
    assert all(x(i) != y(i) for i in range(1000))
