"""Admission (ingest/admission/capacity.py): every threshold from the deadline, the cost curve
and the live workers; nothing refused below capacity; strict order between tiers; the
tenant that owns a backlog is the one refused."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.load_report import LoadReport
from ingest.admission.capacity import (
    BACKLOG_ROUNDS,
    ORDER_WINDOW_S,
    Admission,
    Decision,
    RecentAdmissions,
    timeout_floor_ms,
    wait_budget_s,
    wait_s,
)
from ingest.admission.view import LoadView, ModelLoad

REF = "sim@1"
MARGIN = 0.02


def load(
    items_s: float = 200.0, batch: int = 10, batch_ms: float = 100.0, workers: int = 2
) -> dict[str, float]:
    return {
        "items_s": items_s,
        "batch": batch,
        "batch_ms": batch_ms,
        "single_ms": batch_ms,
        "workers": workers,
    }


def view(
    backlog: dict[str, int] | None = None,
    tenants: dict[str, dict[str, list[float]]] | None = None,
    lag: dict[str, int] | None = None,
    **shape: float,
) -> LoadView:
    v = LoadView.combine(
        [LoadReport({REF: load(**shape)}, {REF: backlog or {}}, lag or {}, {REF: tenants or {}})]
    )
    v.as_of = 0.0
    return v


def admission(max_buffered: int = 20_000) -> Admission:
    return Admission(margin_s=MARGIN, max_buffered=max_buffered)


def offer(
    a: Admission,
    priority: str,
    rate: float,
    until: float,
    start: float = 0.0,
    tenant: str = "",
    admitted: bool = True,
) -> None:
    """Record that ``rate``/s of this class (of ``tenant``, if given) arrived over
    [start, until), and were admitted unless ``admitted`` is false."""
    n = int(rate * (until - start))
    for i in range(n):
        t = start + i / rate
        a.offered.add((REF, priority), t)
        if admitted:
            a.admitted.add((REF, priority), t)
            if tenant:
                a.admitted.add((REF, priority, tenant), t)


def decide(
    a: Admission,
    v: LoadView,
    priority: str,
    *,
    now: float,
    tenant: str = "t",
    deadline_s: float | None = None,
    weight: float = 1.0,
) -> Decision:
    """One request of ``priority`` with its tier's SLO as deadline, unless given."""
    slo = {"enterprise": 1.0, "paid": 2.0, "free": 5.0}[priority]
    return a.decide(
        v,
        REF,
        priority,
        tenant=tenant,
        weight=weight,
        deadline_s=slo if deadline_s is None else deadline_s,
        now=now,
    )


# ---- 0. the deadline, and nothing refused below capacity ------------------------------


def test_a_deadline_shorter_than_a_batch_of_one_is_refused_at_once_saying_so() -> None:
    a = admission()
    d = decide(a, view(batch_ms=2000), "enterprise", now=0.0)
    assert not d.admit and d.reason == "deadline"
    assert "1000 ms" in d.message and "2020 ms" in d.message and "timeout_ms" in d.message
    assert decide(a, view(batch_ms=2000), "free", now=0.0).admit  # 5 s leaves room


@pytest.mark.parametrize("batch_ms", [10, 100, 500, 900, 2000])
def test_an_idle_model_admits_whatever_its_batch_time(batch_ms: float) -> None:
    # 900 ms batches and a 1 s SLO: waiting for a running batch could not fit, yet an
    # idle worker serves the request in time, so it must not be refused.
    a = admission()
    v = view(batch_ms=batch_ms, items_s=2 * 10 / (batch_ms / 1000))
    for tier in ("enterprise", "paid", "free"):
        d = decide(a, v, tier, now=1.0, deadline_s=max(3.0, batch_ms / 1000 + 0.1))
        assert d.admit, (tier, d)


def test_below_capacity_a_queue_past_the_budget_is_not_refused() -> None:
    a = admission()
    offer(a, "enterprise", 150, until=5.0)  # 75% of 200/s
    # 1 s batches, two workers: one batch ahead already exceeds the 1 s SLO's budget,
    # but the stream is below capacity: the queue drains, nothing is refused.
    v = view({"enterprise": 15}, items_s=200, batch=100, batch_ms=1000)
    d = decide(a, v, "enterprise", now=5.0, deadline_s=1.5)
    assert d.admit


def test_a_burst_counts_as_overload_before_the_rate_shows_it() -> None:
    a = admission()
    offer(a, "paid", 10, until=5.0)
    offer(a, "paid", 700, start=5.0, until=6.0)  # 700 in the last second: 3.5 s of work
    backlog = BACKLOG_ROUNDS * 10 * 2 + 500  # queued: 2.6 s of work, past the 2 s SLO
    d = decide(a, view({"paid": backlog}), "paid", now=6.0)
    assert not d.admit and d.reason == "capacity"


def test_a_long_queue_without_a_burst_below_capacity_is_not_refused() -> None:
    # One worker, batches of one: two queued already make "two rounds", but arrivals
    # at half of capacity are no burst.
    a = admission()
    offer(a, "paid", 1, until=30.0)
    v = view({"paid": 4}, items_s=2, batch=1, batch_ms=450, workers=1)
    assert decide(a, v, "paid", now=30.0).admit


# ---- capacity: the wait, at the capacity higher classes leave ---------------------------


def test_overloaded_a_request_waits_for_whole_batches_ahead() -> None:
    shape = ModelLoad(items_s=200, batch=10, batch_ms=100, workers=2)
    assert wait_s(9, shape, 200, 0) == 0  # rides in the batch being formed
    assert wait_s(30, shape, 200, 0) == pytest.approx(0.15)
    assert wait_s(5, shape, 100, 100) == pytest.approx(0.05)  # higher arrivals fill it
    assert math.isinf(wait_s(30, shape, 0, 200))
    assert wait_budget_s(1.0, shape, MARGIN) == pytest.approx(1.0 - 0.1 - 0.05 - MARGIN)


def test_overloaded_the_request_past_its_deadline_is_refused_with_retry_after() -> None:
    a = admission()
    offer(a, "paid", 600, until=5.0)  # 3x capacity
    ok = decide(a, view({"paid": 100}), "paid", now=5.0)  # 0.5 s of work
    late = decide(a, view({"paid": 500}), "paid", now=5.0)  # 2.5 s: past the 2 s SLO
    assert ok.admit
    assert not late.admit and late.reason == "capacity" and late.retry_after_s >= 1
    assert "queued ahead" in late.message


def test_a_lower_class_gets_only_what_higher_arrivals_leave() -> None:
    a = admission()
    offer(a, "enterprise", 190, until=5.0)  # takes nearly all of 200/s
    offer(a, "free", 400, until=5.0)
    v = view({"free": 20})
    assert not decide(a, v, "free", now=5.0).admit
    assert decide(a, v, "enterprise", now=5.0).admit


def test_a_capacity_refusal_of_a_higher_class_refuses_lower_ones_for_the_window() -> None:
    a = admission()
    offer(a, "paid", 150, until=4.0)
    offer(a, "paid", 1000, start=4.0, until=5.0, admitted=False)  # a burst, refused
    v_full = view({"paid": 1000})  # 5 s of work queued
    assert decide(a, v_full, "paid", now=5.0).reason == "capacity"
    empty = view({})
    d = decide(a, empty, "free", now=5.0 + ORDER_WINDOW_S / 2)
    assert not d.admit and d.reason == "order" and d.retry_after_s >= 1
    assert decide(a, empty, "enterprise", now=5.0 + ORDER_WINDOW_S / 2).admit
    assert decide(a, empty, "free", now=5.0 + ORDER_WINDOW_S + 0.01).admit


def test_the_schedulers_buffers_bound_a_class() -> None:
    a = admission(max_buffered=100)
    d = decide(a, view({"free": 100}), "free", now=1.0, deadline_s=600.0)
    assert not d.admit and d.reason == "buffer"


def test_no_reports_yet_admits() -> None:
    a = admission()
    assert a.decide(None, REF, "free", tenant="t", weight=1.0, deadline_s=5.0, now=0.0).admit
    assert decide(a, view(), "free", now=0.0).admit


def test_reports_of_several_schedulers_add_up_and_old_reports_still_read() -> None:
    v = LoadView.combine(
        [
            LoadReport({REF: load(items_s=100, batch_ms=80, workers=1)}, {REF: {"free": 5}}, {}),
            LoadReport({REF: load(items_s=300, batch_ms=120, workers=3)}, {}, {"paid": 3}),
            LoadReport({REF: 50.0}, {REF: {"free": 7, "paid": 2}}, {}),  # before the record
        ]
    )
    c = v.capacity[REF]
    assert (c.items_s, c.workers, c.batch_ms) == (450, 5, 120)
    assert v.backlog == {REF: {"free": 12, "paid": 2}} and v.lag == {"paid": 3}
    assert v.schedulers == 3


# ---- 4. the tenant who builds a backlog pays for it --------------------------------------


def test_the_noisy_tenant_is_refused_and_the_quiet_one_admitted() -> None:
    a = admission()
    offer(a, "paid", 600, until=5.0)
    v = view({"paid": 5001}, {"paid": {"noisy": [5000, 1.0], "quiet": [1, 1.0]}})
    noisy = decide(a, v, "paid", now=5.0, tenant="noisy")
    quiet = decide(a, v, "paid", now=5.0, tenant="quiet")
    assert not noisy.admit and noisy.retry_after_s > 10
    assert quiet.admit


def test_admissions_since_the_report_count_against_their_own_tenant_only() -> None:
    a = admission()
    offer(a, "paid", 600, until=5.0, tenant="noisy")
    v = view({"paid": 0}, {"paid": {}})
    v.as_of = 5.0
    admitted = 0
    while decide(a, v, "paid", now=5.0, tenant="noisy").admit:
        admitted += 1
    assert 300 <= admitted <= 400  # about the 2 s SLO's worth of 200/s, less a batch
    assert decide(a, v, "paid", now=5.0, tenant="quiet").admit


@given(
    higher=st.floats(0, 400),
    free_q=st.integers(0, 5000),
    paid_q=st.integers(0, 5000),
)
def test_free_is_never_admitted_when_paid_would_be_refused(
    higher: float, free_q: int, paid_q: int
) -> None:
    a = admission()
    if higher >= 1:
        offer(a, "enterprise", higher, until=5.0)
    offer(a, "paid", 300, until=5.0)
    offer(a, "free", 300, until=5.0)
    v = view({"paid": paid_q, "free": free_q})
    paid = decide(a, v, "paid", now=5.0, deadline_s=2.0)
    free = decide(a, v, "free", now=5.0, deadline_s=2.0)
    if not paid.admit:
        assert not free.admit


def test_overloaded_a_deadline_shorter_than_two_batches_is_refused_for_it_not_for_capacity() -> (
    None
):
    # 1.5 s batches on one worker: at saturation a paid request (2 s SLO) would wait out
    # a running batch and run its own (3 s). It is refused for its deadline, with a reason
    # that says so, and that does not hold back free requests (5 s), which can wait.
    a = admission()
    for i in range(500):  # 100/s of paid offered (refused: none admitted)
        a.offered.add((REF, "paid"), i / 100)
    v = view({"paid": 5}, items_s=40, batch=60, batch_ms=1500, workers=1)
    d = decide(a, v, "paid", now=5.0)
    assert not d.admit and d.reason == "deadline" and d.retry_after_s >= 1
    assert "while this model's workers are saturated" in d.message
    assert decide(a, v, "free", now=5.0, deadline_s=10.0).admit


def test_a_backlog_longer_than_the_rate_window_is_overload_whoever_built_it() -> None:
    # 10,000 queued by a tenant through other instances: this one saw no arrivals, but
    # 50 s of work cannot be served within a 2 s SLO.
    a = admission()
    v = view({"paid": 10_000}, {"paid": {"noisy": [10_000, 1.0]}})
    d = decide(a, v, "paid", now=1.0, tenant="noisy")
    assert not d.admit and d.reason == "capacity"
    assert decide(a, v, "paid", now=1.0, tenant="quiet").admit


def test_higher_classes_admitted_since_the_reports_are_queued_ahead() -> None:
    """Reports show empty queues, but since them this instance admitted a clump of 100
    enterprise requests (half a second of the workers): a free request overloaded behind
    them counts them, less what the workers served since the report."""
    a = admission()
    offer(a, "enterprise", 100, until=5.0)
    offer(a, "free", 400, until=5.0, admitted=False)
    v = view({})
    v.as_of = 5.0
    quiet = decide(a, v, "free", now=5.0, deadline_s=1.0)
    assert quiet.admit
    for i in range(100):
        a.admitted.add((REF, "enterprise"), 5.0 + i * 1e-4)
        a.admitted_long.add((REF, "enterprise"), 5.0 + i * 1e-4)
    crowded = decide(a, v, "free", now=5.05, deadline_s=1.0)
    assert crowded.predicted_delay_s > quiet.predicted_delay_s
    assert not crowded.admit


# ---- the shortest timeout any batch can meet (decision 62) -----------------------------
@pytest.mark.parametrize(
    ("single_ms", "margin_s", "floor"),
    [(100.0, 0.02, 120), (100.3, 0.02, 121), (7.2, 0.02, 28), (2000.0, 0.0, 2000), (0.4, 0.02, 21)],
)
def test_the_timeout_floor_is_a_batch_of_one_and_the_margin(
    single_ms: float, margin_s: float, floor: int
) -> None:
    shape = ModelLoad(items_s=200, batch=10, batch_ms=single_ms, single_ms=single_ms, workers=2)
    assert timeout_floor_ms(shape, margin_s) == floor
    assert timeout_floor_ms(None, margin_s) == math.ceil(margin_s * 1000)  # nothing reported


def test_a_rate_over_a_window_counts_only_that_window() -> None:
    counts = RecentAdmissions(3600.0, bucket_s=10.0)
    for t in range(0, 600):  # 10/s for ten minutes, then 1/s for the next ten
        for k in range(10):
            counts.add("x", t + k / 10)
    for t in range(600, 1200):
        counts.add("x", float(t))
    now = 1200.0
    assert counts.rate_over("x", now, 600.0) == pytest.approx(1.0)
    assert counts.rate_over("x", now, 1200.0) == pytest.approx(5.5)
    # Longer than counting has run: over what was counted, not diluted by the rest.
    assert counts.rate_over("x", now, 3000.0) == pytest.approx(5.5)
    assert counts.rate_over("y", now, 600.0) == 0.0


def test_a_rate_over_a_window_is_capped_at_the_horizon() -> None:
    counts = RecentAdmissions(100.0, bucket_s=10.0)
    for t in range(0, 300):
        counts.add("x", float(t) + (0.5 if t >= 200 else 0.0))
        if t >= 200:
            counts.add("x", float(t) + 0.6)
    assert counts.rate_over("x", 300.0, 10_000.0) == pytest.approx(2.0)
