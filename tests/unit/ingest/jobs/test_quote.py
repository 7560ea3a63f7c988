"""Completion-time quotes (ingest/jobs/quote.py, decision 69): the rate left to jobs,
weighted sharing among tenants' backlogs, what the schedulers have read of them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import Conflict
from ingest.jobs.estimates import refuse_unmeetable
from ingest.jobs.quote import (
    Pending,
    completion_at,
    finishes,
    in_place,
    job_rate,
    queued_now,
    read_window,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def drr_finish_s(rate: float, own: int, weight: int, others: list[tuple[int, int]]) -> float:
    """When the last of ``own`` items is served by an item-level weighted deficit round
    robin (as scheduler/core/fairness.py serves job items), one item every 1/rate s."""
    flows = [[own, weight, 0.0], *[[n, w, 0.0] for n, w in others]]
    served = 0
    while flows[0][0] > 0:
        for f in flows:
            if f[0] <= 0:
                continue
            f[2] += f[1]
            while f[2] >= 1 and f[0] > 0:
                f[0] -= 1
                f[2] -= 1
                served += 1
                if f is flows[0] and f[0] == 0:
                    return served / rate
            if f[0] == 0:
                f[2] = 0.0  # an emptied flow banks no credit
    return served / rate


INF = float("inf")


def jobs(*flows: tuple[str, float] | tuple[str, float, float]) -> list[Pending]:
    """Jobs in submission order: (tenant, items left[, weight])."""
    out = []
    for k, f in enumerate(flows):
        weight = f[2] if len(f) == 3 else 1.0
        out.append(Pending(f"j{k}", f[0], T0 + timedelta(minutes=k), f[1], weight))
    return out


def drain_s(rate: float, stream: list[Pending], target: int, window: float) -> float:
    """Seconds until every item of ``stream[target]`` is served, at ``rate`` items/s."""
    return finishes(stream, window)[target] / rate


def last(stream: list[Pending], rate: float, window: float = INF) -> float:
    return drain_s(rate, stream, len(stream) - 1, window)


def test_one_tenant_alone_gets_the_whole_rate() -> None:
    assert last(jobs(("A", 1000)), 100.0) == pytest.approx(10.0)


def test_equal_tenants_split_the_rate_until_one_finishes() -> None:
    # Both at 50/s until the other's 200 are done at 4 s; the 800 left at 100/s.
    assert last(jobs(("B", 200), ("A", 1000)), 100.0) == pytest.approx(12.0)
    assert last(jobs(("B", 1000), ("A", 1000)), 100.0) == pytest.approx(20.0)


def test_unequal_weights_share_in_proportion() -> None:
    # Weight 3 against 1: 75/s while the other lasts past the job.
    assert last(jobs(("B", 10_000, 1.0), ("A", 900, 3.0)), 100.0) == pytest.approx(12.0)
    # Weight 1 against 3 and 1: 20/s until the weight-3 backlog (300, at 60/s) ends at
    # 5 s (100 done), then 50/s beside the weight-1 other for the 300 left.
    stream = jobs(("B", 300, 3.0), ("C", 10_000, 1.0), ("A", 400, 1.0))
    assert last(stream, 100.0) == pytest.approx(5.0 + 300 / 50)


def test_many_tenants_water_fill() -> None:
    stream = jobs(("B", 100), ("C", 200), ("D", 5_000, 2.0), ("A", 500))
    # W=5: 20/s each share unit. B ends at 5 s (own: 100 done); W=4, 25/s: C (100 left)
    # ends 4 s later (own: 200); W=3: own 33.3/s for its 300 left -> 9 s.
    assert last(stream, 100.0) == pytest.approx(5 + 4 + 9)


@settings(max_examples=60, deadline=None)
@given(
    own=st.integers(1, 400),
    weight=st.integers(1, 4),
    others=st.lists(st.tuples(st.integers(0, 400), st.integers(1, 4)), max_size=5),
    rate=st.floats(10.0, 1000.0),
)
def test_sharing_matches_an_item_level_deficit_round_robin(
    own: int, weight: int, others: list[tuple[int, int]], rate: float
) -> None:
    stream = jobs(*[(f"t{i}", n, w) for i, (n, w) in enumerate(others)], ("own", own, weight))
    fluid = last(stream, rate)
    items = drr_finish_s(rate, own, weight, others)
    # The round robin serves whole items a turn: it is off by at most a round.
    round_s = (weight + sum(w for _, w in others)) / rate
    assert abs(fluid - items) <= round_s + 1e-9


def test_a_job_behind_another_tenants_waits_for_what_is_not_read() -> None:
    """Decision 9's limit: B's 1,000 items were published first; the schedulers hold 600
    read. A's 500 are read only once B's unread 400 are served (4 s at 100/s); then the
    two share: A's 500 at 50/s, 10 s."""
    stream = jobs(("B", 1000), ("A", 500))
    assert last(stream, 100.0, window=600) == pytest.approx(14.0)
    assert last(stream, 100.0) == pytest.approx(10.0)  # all read: shared from the start
    assert last(stream, 100.0, window=0) == pytest.approx(15.0)  # nothing read: in order
    # And B, ahead, has the rate to itself until A's items are read: still 15 s in all.
    assert drain_s(100.0, stream, 0, 600) == pytest.approx(15.0)
    assert drain_s(100.0, stream, 0, 0) == pytest.approx(10.0)


def test_a_second_tenants_job_as_measured_on_the_development_box() -> None:
    """docs/bench/quotes.md: a 12,500-item job had 9,281 left when another tenant's
    6,250 came, and the second moved once the first had served 2,745 more (so 6,536
    were read). The second then shares: 55/s each, its 6,250 before the first's 6,536."""
    stream = jobs(("first", 9_281), ("second", 6_250))
    got = last(stream, 110.0, window=6_536)
    assert got == pytest.approx(2_745 / 110 + 6_250 / 55)


@settings(max_examples=80, deadline=None)
@given(
    flows=st.lists(
        st.tuples(st.sampled_from("ABC"), st.integers(1, 500), st.integers(1, 3)),
        max_size=6,
    ),
    own=st.integers(1, 500),
    window=st.integers(0, 1500),
    rate=st.floats(10.0, 1000.0),
)
def test_a_new_tenants_job_waits_for_what_is_unread_and_never_past_all_of_it(
    flows: list[tuple[str, int, int]], own: int, window: int, rate: float
) -> None:
    """A new tenant's job published last: nothing read, it comes after everything; all
    read, it shares from the start; in between, no earlier than sharing from the start
    (what it waits for is served before it) and no later than everything."""
    weight = {t: w for t, _, w in flows}  # a tenant's weight is its own, whichever job
    stream = jobs(*[(t, n, weight[t]) for t, n, _ in flows], ("new", own))
    total_s = (sum(n for _, n, _ in flows) + own) / rate
    assert last(stream, rate, window=0) == pytest.approx(total_s)
    got = last(stream, rate, window=window)
    assert last(stream, rate) - 1e-6 <= got <= total_s + 1e-6


def test_the_rate_left_to_jobs_is_capacity_less_the_sync_take() -> None:
    assert job_rate(500.0, 120.0) == 380.0
    assert job_rate(500.0, 900.0) == 0.0  # sync takes it all: no quote, not a negative one


def test_no_capacity_gives_no_quote() -> None:
    assert completion_at(1_000.0, lambda h: 0.0, 1010.0) is None


def test_a_job_with_nothing_left_is_due_now() -> None:
    assert finishes(jobs(("A", 0)), INF) == [0.0]
    assert completion_at(1_000.0, lambda h: 50.0, 0.0) == 1_000.0


def test_the_sync_take_is_forecast_by_its_mean_over_the_quotes_horizon() -> None:
    # Sync takes most of the workers now (jobs get 20/s), but over the last 100 s jobs
    # got 100/s on average: 10,000 items are quoted at the mean, not at the moment's rate.
    asked: list[float] = []

    def rate_over(h: float) -> float:
        asked.append(h)
        return 20.0 if h == 0 else 100.0

    got = completion_at(0.0, rate_over, 10_000.0)
    assert asked == [0.0, 500.0]  # the horizon: what the moment's rate says is left
    assert got == pytest.approx(100.0)


def test_a_steady_take_quotes_the_work_at_that_rate() -> None:
    stream = jobs(("A", 200), ("B", 600, 2.0), ("A", 1_000))
    work = finishes(stream, 700)[2]
    assert completion_at(50.0, lambda h: 80.0, work) == pytest.approx(
        50.0 + drain_s(80.0, stream, 2, 700)
    )


def test_every_time_scales_as_one_over_the_rate() -> None:
    stream = jobs(("B", 1000), ("A", 500), ("C", 300, 2.0), ("A", 50))
    for k in range(len(stream)):
        assert drain_s(40.0, stream, k, 600) == pytest.approx(finishes(stream, 600)[k] / 40)


def test_items_of_the_tenant_ahead_count_wholly_before_the_job() -> None:
    # 500 of its own ahead and 500 of the job alone at 100/s: 10 s.
    assert last(jobs(("A", 500), ("A", 500)), 100.0) == pytest.approx(10.0)


def _pending(job: str, tenant: str, minutes: int, remaining: float, weight: float) -> Pending:
    return Pending(job, tenant, T0 + timedelta(minutes=minutes), remaining, weight)


def test_jobs_take_their_place_in_submission_order_with_their_own_count() -> None:
    pending = [
        _pending("a3", "A", 9, 700, 2.0),
        _pending("a1", "A", 0, 300, 2.0),
        _pending("b1", "B", 1, 100, 1.0),
        _pending("a2", "A", 5, 400, 2.0),
    ]
    job = _pending("a2", "A", 5, 350, 2.0)  # its own row, read a moment later
    stream = in_place(pending, [job])
    assert [p.job_id for p in stream] == ["a1", "b1", "a2", "a3"] and stream[2] == job
    # A job the backlog read missed (it ended meanwhile) still has a place.
    stream = in_place(pending[:2], [job])
    assert [p.job_id for p in stream] == ["a1", "a2", "a3"]


def test_a_flex_request_is_quoted_as_a_job_of_its_inputs_behind_its_tenants_jobs() -> None:
    """Decision 66 queues flex with job items: its place is a new job's of its size."""
    pending = [_pending("a1", "A", 0, 1000, 1.0), _pending("b1", "B", 1, 3000, 1.0)]
    now = T0 + timedelta(minutes=2)
    stream, k = queued_now("A", 1, 1.0, now, pending)
    assert k == 2 and stream[k].remaining == 1 and stream[k].created_at == now
    # A's 1,001 items at half of 100/s while B's backlog lasts: 20.02 s.
    assert drain_s(100.0, stream, k, INF) == pytest.approx(20.02)
    # A tenant with no job of the model: its own share of what the others leave.
    stream, k = queued_now("C", 2, 1.0, now, pending)
    assert drain_s(100.0, stream, k, INF) == pytest.approx(2 * 3 / 100)


def test_an_unmeetable_window_is_a_409_naming_the_field_and_the_earliest() -> None:
    now = T0
    start = int(now.timestamp())
    refuse_unmeetable(None, 60, now)  # no quote: accepted
    refuse_unmeetable(start + 60, 60, now)  # just in time: accepted
    with pytest.raises(Conflict) as caught:
        refuse_unmeetable(start + 3_601, 3_600, now)
    assert caught.value.field == "completion_window_s"
    assert "completion_window_s >= 3601" in caught.value.message
    assert "earliest" in caught.value.message and str(start + 3_601) in caught.value.message


def test_the_read_window_is_what_the_schedulers_hold_or_more_where_tenants_show_it() -> None:
    stream = jobs(("first", 6_250), ("second", 6_000), ("third", 500))
    assert read_window(stream, 0, {}) == INF  # nothing held, or no report: all read
    assert read_window(stream, 5_000, {"first": 5_000}) == 5_000
    # The second tenant holds items: the first's 6,250 are read whole, and 800 of its.
    assert read_window(stream, 5_000, {"first": 4_200, "second": 800}) == 6_250 + 800
    # The many small tenants summed ("*") and tenants with no job here say nothing.
    assert read_window(stream, 5_000, {"*": 900, "other": 40}) == 5_000
