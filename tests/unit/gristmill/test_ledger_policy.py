"""The durability ledger's pure policy (gristmill/ledger/policy.py, decision 54): what a
message is, when it is looked up again, what a partition may count and store, and that
a redelivery, a duplicate or hostile bytes never change a count."""

from __future__ import annotations

import uuid

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.messages import RequestMessage
from gristmill.ledger.policy import (
    AGE_BOUNDS,
    RECHECK_MAX_S,
    RECHECK_MIN_S,
    Counts,
    Entry,
    PartitionBook,
    RowSeen,
    State,
    complete,
    judge,
    merge_counts,
    next_check,
    overdue,
    read_entry,
    unreconciled,
    wants_pause,
)

TP = ("gm.requests.paid", 0)
TENANT = str(uuid.uuid4())
T0 = 1_800_000_000.0  # a minute boundary: 1_800_000_000 = 30_000_000 * 60


def entry(offset: int, *, at: float = T0, deadline: float | None = None, rid: str = "") -> Entry:
    return Entry(
        offset,
        rid or str(uuid.uuid4()),
        TENANT,
        at,
        at + 2 if deadline is None else deadline,
        at + 0.01,
    )


def here(e: Entry) -> RowSeen:
    return RowSeen((TP[0], TP[1], e.offset))


# --- reading a message ---


def test_read_entry_takes_what_the_api_writes() -> None:
    m = RequestMessage(
        request_id=str(uuid.uuid4()),
        tenant_id=TENANT,
        priority="paid",
        model="sim",
        version="1",
        input="x",
        params={},
        deadline=T0 + 2,
        received_at=T0,
    )
    e = read_entry(m.encode(), 7, T0 + 0.01)
    assert e == Entry(7, m.request_id, TENANT, T0, T0 + 2, T0 + 0.01)
    assert e.minute == T0


def test_read_entry_canonicalises_the_ids() -> None:
    rid = uuid.uuid4()
    raw = orjson.dumps({"request_id": str(rid).upper(), "tenant_id": "{" + TENANT + "}"})
    e = read_entry(raw, 0, T0)
    assert e.request_id == str(rid) and e.tenant_id == TENANT


@pytest.mark.parametrize(
    "raw",
    [
        None,
        b"",
        b"\x00\xff",
        b"not json",
        b"[]",
        b"{}",
        b'{"request_id": "x", "tenant_id": "y"}',
        b'{"request_id": 5, "tenant_id": null}',
        orjson.dumps({"request_id": str(uuid.uuid4())}),
        orjson.dumps({"tenant_id": TENANT}),
    ],
)
def test_a_message_naming_no_request_is_unreadable(raw: bytes | None) -> None:
    e = read_entry(raw, 3, T0)
    assert e.request_id == "" and judge(e, TP, None, 10) is State.UNREADABLE


@pytest.mark.parametrize("bad", [None, "soon", -1, 0, 1e300, True, [1], {"t": 1}])
def test_times_that_are_not_times_fall_back_to_the_brokers(bad: object) -> None:
    raw = orjson.dumps(
        {"request_id": str(uuid.uuid4()), "tenant_id": TENANT, "received_at": bad, "deadline": bad}
    )
    e = read_entry(raw, 0, T0 + 5)
    assert e.request_id and e.received_at == T0 + 5 and e.deadline == T0 + 5


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_read_without_raising(raw: bytes) -> None:
    e = read_entry(raw, 1, T0)
    assert e.offset == 1 and (e.request_id == "" or uuid.UUID(e.request_id))


# --- judging one message ---


def test_a_row_from_this_message_is_terminal() -> None:
    e = entry(4)
    assert judge(e, TP, here(e), None) is State.TERMINAL
    assert judge(e, TP, RowSeen(None), None) is State.TERMINAL  # a row without a position


def test_a_row_from_another_copy_makes_this_one_a_duplicate() -> None:
    e = entry(4)
    assert judge(e, TP, RowSeen((TP[0], 1, 99)), 100) is State.DUPLICATE
    assert judge(e, TP, RowSeen((TP[0], TP[1], 5)), 100) is State.DUPLICATE


def test_no_row_below_the_schedulers_commit_is_missing() -> None:
    e = entry(4)
    assert judge(e, TP, None, 5) is State.MISSING
    assert judge(e, TP, None, 4) is State.PENDING  # the commit is the next to read
    assert judge(e, TP, None, None) is State.PENDING  # the scheduler never committed


def test_overdue_after_the_deadline_plus_the_grace() -> None:
    e = entry(0, deadline=T0 + 2)
    assert not overdue(e, T0 + 2 + 60, 60)
    assert overdue(e, T0 + 2 + 60.001, 60)


def test_next_check_backs_off_with_age_within_bounds() -> None:
    young = entry(0, at=T0, deadline=T0 + 10_000)
    assert next_check(young, T0, 60) == pytest.approx(T0 + RECHECK_MIN_S)
    assert next_check(young, T0 + 40, 60) == pytest.approx(T0 + 50.0)
    assert next_check(young, T0 + 1000, 60) == pytest.approx(T0 + 1000 + RECHECK_MAX_S)


def test_next_check_never_passes_the_moment_it_turns_overdue() -> None:
    e = entry(0, at=T0, deadline=T0 + 1)
    assert next_check(e, T0 + 100, 5) == pytest.approx(T0 + 100 + 25)  # already overdue
    assert next_check(e, T0 + 3, 5) == pytest.approx(T0 + 3 + 0.75)
    assert next_check(e, T0 + 5.9, 5) == pytest.approx(T0 + 6)


# --- a partition's book ---


def test_counts_move_only_over_a_settled_prefix() -> None:
    book = PartitionBook(TP, stored=10)
    es = [entry(o) for o in range(10, 15)]
    for e in es:
        book.add(e)
    # 11..14 have rows, 10 does not yet: nothing may be stored past 10.
    for e in es[1:]:
        assert book.record(e, here(e), None, T0, 60) is State.TERMINAL
    assert book.record(es[0], None, None, T0, 60) is State.PENDING
    assert book.settle() is None
    assert book.unsettled_by_key() == {(TENANT, int(T0)): 5}
    book.record(es[0], here(es[0]), None, T0 + 1, 60)
    s = book.settle()
    assert s is not None and (s.old_offset, s.new_offset, s.taken) == (10, 15, 5)
    assert s.counts == {(TENANT, int(T0)): Counts(accepted=5, terminal=5)}
    assert len(book) == 5  # not taken off until stored
    book.stored_at(s)
    assert len(book) == 0 and book.stored == 15 and book.settle() is None


def test_a_failed_store_leaves_the_book_as_it_was() -> None:
    book = PartitionBook(TP, stored=0)
    e = entry(0)
    book.add(e)
    book.record(e, here(e), None, T0, 60)
    first = book.settle()
    again = book.settle()  # the store failed; the next one counts the same
    assert first is not None and again is not None
    assert (first.new_offset, first.counts) == (again.new_offset, again.counts)


def test_a_redelivery_is_never_counted_twice() -> None:
    book = PartitionBook(TP, stored=0)
    es = [entry(o) for o in range(3)]
    for e in es:
        book.add(e)
    for e in es:  # the consumer re-reads after a seek: ignored
        book.add(e)
    assert len(book) == 3
    for e in es:
        book.record(e, here(e), None, T0, 60)
    s = book.settle()
    assert s is not None
    book.stored_at(s)
    for e in es:  # below the stored offset: ignored
        book.add(e)
    assert len(book) == 0 and book.settle() is None


def test_an_out_of_order_offset_below_what_is_held_is_ignored() -> None:
    book = PartitionBook(TP, stored=0)
    book.add(entry(5))
    book.add(entry(3))
    assert [e.offset for e, _ in book.held()] == [5]


def test_gaps_after_the_last_message_are_passed() -> None:
    book = PartitionBook(TP, stored=0)
    e = entry(0)
    book.add(e)
    book.position = 3  # offsets 1 and 2 were transaction markers
    book.record(e, here(e), None, T0, 60)
    s = book.settle()
    assert s is not None and s.new_offset == 3


def test_a_partition_whose_oldest_messages_expired_from_kafka_starts_at_the_oldest_left() -> None:
    book = PartitionBook(TP, stored=2, position=50)
    s = book.settle()
    assert s is not None and (s.old_offset, s.new_offset, s.counts) == (2, 50, {})


def test_missing_and_duplicates_and_unreadable_are_counted_apart() -> None:
    book = PartitionBook(TP, stored=0)
    ok, lost, dup = entry(0), entry(1), entry(2)
    junk = Entry(3, "", "", T0, T0, T0)
    for e in (ok, lost, dup, junk):
        book.add(e)
    committed = 4
    for e in book.due(T0, committed):
        row = {ok.offset: here(ok), dup.offset: RowSeen(("t", 9, 9))}.get(e.offset)
        book.record(e, row, committed, T0, 60)
    s = book.settle()
    assert s is not None
    assert s.counts == {(TENANT, int(T0)): Counts(accepted=2, terminal=1, missing=1, duplicate=1)}
    assert s.missing == [lost]
    assert s.outcomes == {
        State.TERMINAL: 1,
        State.MISSING: 1,
        State.DUPLICATE: 1,
        State.UNREADABLE: 1,
    }


def test_due_asks_again_when_the_commit_passes_or_the_time_comes() -> None:
    book = PartitionBook(TP, stored=0)
    e = entry(0, deadline=T0 + 1000)
    book.add(e)
    assert book.due(T0, None) == [e]  # never looked up
    book.record(e, None, None, T0, 60)
    assert book.due(T0 + 0.1, None) == []
    assert book.due(T0 + 0.1, 1) == [e]  # the scheduler committed past it
    assert book.due(T0 + RECHECK_MIN_S, None) == [e]


def test_a_settled_message_is_not_judged_again() -> None:
    book = PartitionBook(TP, stored=0)
    e = entry(0)
    book.add(e)
    book.record(e, here(e), None, T0, 60)
    assert book.record(e, None, 5, T0, 60) is State.TERMINAL
    assert book.due(T0 + 100, 5) == []


def test_settled_through_is_the_first_uncounted_message_or_the_end() -> None:
    book = PartitionBook(TP, stored=0)
    a, b = entry(0, at=T0), entry(1, at=T0 + 5)
    book.add(a)
    book.add(b)
    assert book.settled_through(0, None) == a.appended_at
    assert book.settled_through(1, None) == b.appended_at
    assert book.settled_through(2, T0 + 9) == T0 + 9
    assert book.settled_through(2, None) is None


# --- what the metrics and the export show ---


def test_unreconciled_by_age_and_overdue() -> None:
    book = PartitionBook(TP, stored=0)
    now = T0 + 5000
    ages = [0.5, 5, 30, 300, 3000, 4000]
    es = [entry(i, at=now - a, deadline=now - a + 2) for i, a in enumerate(ages)]
    for e in es:
        book.add(e)
    for e in es:
        book.record(e, None, None, now, 60)
    done = entry(6, at=now - 9999)
    book.add(done)
    book.record(done, here(done), None, now, 60)
    u = unreconciled([book], now, 60)
    assert list(u.by_age.values()) == [1, 1, 1, 1, 1, 1]
    assert set(u.by_age) == set(AGE_BOUNDS)
    assert u.overdue == 3  # 300, 3000, 4000 s old with a 2 s deadline and a 60 s grace
    assert u.oldest_s == pytest.approx(4000)


def test_pause_at_the_window_resume_at_half() -> None:
    assert not wants_pause(9, 10, False) and wants_pause(10, 10, False)
    assert wants_pause(6, 10, True) and not wants_pause(5, 10, True)


def test_merge_counts_adds_partitions() -> None:
    a, b = PartitionBook(TP, 0), PartitionBook(("t", 1), 0)
    for book in (a, b):
        e = entry(0)
        book.add(e)
        book.record(e, RowSeen(None), None, T0, 60)
    merged = merge_counts([s for s in (a.settle(), b.settle()) if s])
    assert merged == {(TENANT, int(T0)): Counts(accepted=2, terminal=2)}


def test_complete_needs_every_partition_past_the_period_and_the_produce_time() -> None:
    assert complete({TP: T0 + 10, ("t", 1): T0 + 5}, T0, 5)
    assert not complete({TP: T0 + 10, ("t", 1): T0 + 4.9}, T0, 5)
    assert not complete({TP: T0 + 10, ("t", 1): None}, T0, 5)
    assert not complete({}, T0, 5)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(["row", "none", "dup"]), min_size=1, max_size=40),
    st.lists(st.integers(min_value=0, max_value=40), max_size=10),
)
def test_storing_in_any_rhythm_counts_each_message_once(
    fates: list[str], store_after: list[int]
) -> None:
    """Whatever order rows arrive in and whenever stores happen (some of them failing),
    the sum stored equals one count per message."""
    book = PartitionBook(TP, stored=0)
    es = [entry(i) for i in range(len(fates))]
    for e in es:
        book.add(e)
    applied = []
    stops = set(store_after)
    for i, (e, fate) in enumerate(zip(es, fates, strict=True)):
        row = {"row": here(e), "dup": RowSeen(("x", 0, 0)), "none": None}[fate]
        book.record(e, row, len(fates), T0, 60)
        s = book.settle() if i in stops or i == len(es) - 1 else None
        if s is not None and (i % 2 == 0 or i == len(es) - 1):  # odd stores "fail"
            applied.append(s)
            book.stored_at(s)
    stored = merge_counts(applied).get((TENANT, int(T0)), Counts())
    assert stored.terminal == fates.count("row")
    assert stored.missing == fates.count("none")
    assert stored.duplicate == fates.count("dup")
    assert stored.accepted == stored.terminal + stored.missing
    assert book.stored == len(fates) and len(book) == 0
