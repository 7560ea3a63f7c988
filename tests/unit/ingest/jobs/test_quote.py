"""Completion-time quotes (ingest/jobs/quote.py, decision 69): the rate left to jobs,
weighted sharing among tenants' backlogs, the blend with a running job's own rate."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import Conflict
from ingest.jobs.estimates import refuse_unmeetable
from ingest.jobs.quote import (
    Flow,
    JobPlace,
    Pending,
    completion_at,
    job_rate,
    place_in_queue,
    queued_now,
    remaining_s,
    shared_drain_s,
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


def test_one_tenant_alone_gets_the_whole_rate() -> None:
    assert shared_drain_s(100.0, 1000, 1.0, []) == pytest.approx(10.0)


def test_equal_tenants_split_the_rate_until_one_finishes() -> None:
    # Both at 50/s until the other's 200 are done at 4 s; the 800 left at 100/s.
    assert shared_drain_s(100.0, 1000, 1.0, [Flow(200, 1.0)]) == pytest.approx(12.0)
    assert shared_drain_s(100.0, 1000, 1.0, [Flow(1000, 1.0)]) == pytest.approx(20.0)


def test_unequal_weights_share_in_proportion() -> None:
    # Weight 3 against 1: 75/s while the other lasts past the job.
    assert shared_drain_s(100.0, 900, 3.0, [Flow(10_000, 1.0)]) == pytest.approx(12.0)
    # Weight 1 against 3 and 1: 20/s until the weight-3 backlog (300, at 60/s) ends at
    # 5 s (100 done), then 50/s beside the weight-1 other for the 300 left.
    assert shared_drain_s(100.0, 400, 1.0, [Flow(300, 3.0), Flow(10_000, 1.0)]) == pytest.approx(
        5.0 + 300 / 50
    )


def test_many_tenants_water_fill() -> None:
    others = [Flow(100, 1.0), Flow(200, 1.0), Flow(5_000, 2.0)]
    # W=5: 20/s each share unit. Flow 100 ends at 5 s (own: 100 done); W=4, 25/s: flow
    # 200 (100 left) ends 4 s later (own: 200); W=3: own 33.3/s for its 300 left -> 9 s.
    assert shared_drain_s(100.0, 500, 1.0, others) == pytest.approx(5 + 4 + 9)


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
    fluid = shared_drain_s(rate, own, weight, [Flow(n, w) for n, w in others])
    items = drr_finish_s(rate, own, weight, others)
    # The round robin serves whole items a turn: it is off by at most a round.
    round_s = (weight + sum(w for _, w in others)) / rate
    assert abs(fluid - items) <= round_s + 1e-9


def test_the_rate_left_to_jobs_is_capacity_less_the_sync_take() -> None:
    assert job_rate(500.0, 120.0) == 380.0
    assert job_rate(500.0, 900.0) == 0.0  # sync takes it all: no quote, not a negative one


def test_no_capacity_gives_no_quote() -> None:
    place = JobPlace(0, 1000, 1.0)
    assert remaining_s(0.0, place, []) is None
    assert completion_at(1_000.0, lambda h: 0.0, place, [Flow(10, 1.0)]) is None


def test_a_job_with_nothing_left_is_due_now() -> None:
    assert completion_at(1_000.0, lambda h: 50.0, JobPlace(0, 0, 1.0), []) == 1_000.0


def test_the_sync_take_is_forecast_by_its_mean_over_the_quotes_horizon() -> None:
    # Sync takes most of the workers now (jobs get 20/s), but over the last 100 s jobs
    # got 100/s on average: 10,000 items are quoted at the mean, not at the moment's rate.
    asked: list[float] = []

    def rate_over(h: float) -> float:
        asked.append(h)
        return 20.0 if h == 0 else 100.0

    got = completion_at(0.0, rate_over, JobPlace(0, 10_000, 1.0), [])
    assert asked == [0.0, 500.0]  # the horizon: what the moment's rate says is left
    assert got == pytest.approx(100.0)


def test_a_steady_take_quotes_as_before() -> None:
    place, others = JobPlace(200, 1_000, 1.0), [Flow(600, 2.0)]
    assert completion_at(50.0, lambda h: 80.0, place, others) == pytest.approx(
        50.0 + remaining_s(80.0, place, others)  # type: ignore[operator]
    )


def test_items_of_the_tenant_ahead_count_wholly_before_the_job() -> None:
    # 500 of its own ahead and 500 of the job alone at 100/s: 10 s.
    assert remaining_s(100.0, JobPlace(500, 500, 1.0), []) == pytest.approx(10.0)


def _pending(job: str, tenant: str, minutes: int, remaining: float, weight: float) -> Pending:
    return Pending(job, tenant, T0 + timedelta(minutes=minutes), remaining, weight)


def test_the_place_in_queue_separates_own_earlier_jobs_from_other_tenants() -> None:
    pending = [
        _pending("a1", "A", 0, 300, 2.0),
        _pending("a2", "A", 5, 400, 2.0),
        _pending("a3", "A", 9, 700, 2.0),
        _pending("b1", "B", 1, 100, 1.0),
        _pending("b2", "B", 6, 50, 1.0),
        _pending("c1", "C", 2, 1000, 3.0),
    ]
    ahead, others = place_in_queue("A", "a2", T0 + timedelta(minutes=5), pending)
    assert ahead == 300  # a1 only: a3 came later, a2 is the job itself
    assert sorted((f.remaining, f.weight) for f in others) == [(150, 1.0), (1000, 3.0)]
    # A job not yet submitted is behind all of its tenant's.
    ahead, _ = place_in_queue("A", None, None, pending)
    assert ahead == 1400
    # A tenant with nothing pending: nothing ahead, every other tenant a flow.
    ahead, others = place_in_queue("D", None, None, pending)
    assert ahead == 0 and len(others) == 3


def test_a_flex_request_is_quoted_as_a_job_of_its_inputs_behind_its_tenants_jobs() -> None:
    """Decision 66 queues flex with job items: its place is a new job's of its size."""
    pending = [_pending("a1", "A", 0, 1000, 1.0), _pending("b1", "B", 1, 3000, 1.0)]
    place, others = queued_now("A", 1, 1.0, pending)
    assert place == JobPlace(1000, 1, 1.0) and others == [Flow(3000, 1.0)]
    # A's 1,001 items at half of 100/s while B's backlog lasts: 20.02 s.
    assert remaining_s(100.0, place, others) == pytest.approx(20.02)
    # A tenant with no job of the model: its own share of what the others leave.
    place, others = queued_now("C", 2, 1.0, pending)
    assert place.ahead == 0 and remaining_s(100.0, place, others) == pytest.approx(2 * 3 / 100)


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
