"""Admission per tenant inside a class: the tenant that owns a backlog is shed first."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.load_report import REST, LoadReport
from ingest.admission import (
    LoadView,
    RecentAdmissions,
    decide,
    own_queue_now,
    predicted_delay_s,
    share_ahead,
)
from scheduler.batcher import Batcher, BatchKey, FlushPolicy
from scheduler.costmodel import CostModel
from scheduler.load_report import tenant_backlog
from tests.unit.helpers import pending

THRESH = {"enterprise": 2000.0, "paid": 600.0, "free": 250.0}


def view(capacity: float, paid: dict[str, list[float]], **extra: dict[str, int]) -> LoadView:
    total = int(sum(n for t, (n, _) in paid.items()))
    return LoadView(
        {"sim@1": capacity},
        {"sim@1": {"paid": total, **extra.get("backlog", {})}},
        extra.get("lag", {}),
        {"sim@1": {"paid": paid}},
    )


def test_noisy_tenant_is_shed_and_quiet_one_admitted() -> None:
    v = view(100, {"noisy": [5000, 1.0], "quiet": [1, 1.0]})
    noisy = decide(v, "sim@1", "paid", utilization=1.0, thresholds_ms=THRESH, tenant="noisy")
    quiet = decide(v, "sim@1", "paid", utilization=1.0, thresholds_ms=THRESH, tenant="quiet")
    assert not noisy.admit and noisy.retry_after_s == pytest.approx(50.01)
    assert quiet.admit and quiet.predicted_delay_s == pytest.approx(
        3 / 100
    )  # its own + one turn of noisy


def test_a_tenant_new_to_the_queue_waits_one_turn_per_other_tenant() -> None:
    by_tenant = {"a": [100.0, 1.0], "b": [100.0, 1.0], "c": [1.0, 1.0]}
    assert share_ahead(by_tenant, "new", 1.0, 0.0) == 1 + 1 + 1


def test_weights_scale_the_turns() -> None:
    # a has weight 4: while our one request waits, a is served 4 of its own.
    assert share_ahead({"a": [100.0, 4.0]}, "me", 1.0, 0.0) == 4
    # our weight 2: a gets half a turn per request of ours
    assert share_ahead({"a": [100.0, 1.0], "me": [3.0, 2.0]}, "me", 2.0, 3.0) == 3 + 2


def test_rest_counts_one_turn_per_small_tenant() -> None:
    assert share_ahead({REST: [50.0, 10.0]}, "me", 1.0, 0.0) == 10
    assert share_ahead({REST: [5.0, 10.0]}, "me", 1.0, 0.0) == 5


def test_without_a_tenant_breakdown_the_whole_class_counts() -> None:
    v = LoadView({"sim@1": 100}, {"sim@1": {"paid": 500}}, {})
    assert predicted_delay_s(v, "sim@1", "paid", 1.0, "quiet") == pytest.approx(5.0)


def test_higher_classes_and_lag_still_count_in_full() -> None:
    v = view(100, {"noisy": [10, 1.0]}, backlog={"enterprise": 50}, lag={"paid": 20})
    assert predicted_delay_s(v, "sim@1", "paid", 1.0, "quiet") == pytest.approx((50 + 1 + 20) / 100)


def test_combine_adds_tenant_queues_across_schedulers() -> None:
    a = LoadReport({"sim@1": 1}, {}, {}, {"sim@1": {"paid": {"x": [3, 2.0], REST: [4, 2]}}})
    b = LoadReport({"sim@1": 1}, {}, {}, {"sim@1": {"paid": {"x": [5, 2.0], REST: [1, 1]}}})
    v = LoadView.combine([a, b])
    assert v.tenants == {"sim@1": {"paid": {"x": [8, 2.0], REST: [5, 3]}}}


@given(
    queues=st.dictionaries(
        st.sampled_from("abcdefgh"),
        st.tuples(st.integers(0, 10_000), st.floats(0.1, 10)),
        max_size=8,
    ),
    me=st.sampled_from("abcdefghz"),
    weight=st.floats(0.1, 10),
)
def test_share_ahead_is_bounded_by_the_class_and_by_own_queue(
    queues: dict[str, tuple[int, float]], me: str, weight: float
) -> None:
    by_tenant = {t: [float(n), w] for t, (n, w) in queues.items()}
    own = by_tenant.get(me, [0.0, weight])[0]
    ahead = share_ahead(by_tenant, me, weight, own)
    assert own <= ahead <= sum(n for n, _ in by_tenant.values()) + (0 if me in by_tenant else own)
    # a tenant with more queued never waits less than one with fewer (same weights)
    assert share_ahead(by_tenant, me, weight, max(0.0, own - 1)) <= ahead


def test_report_names_the_largest_tenants_and_sums_the_rest() -> None:
    depths = {("sim", "1"): [{}, {f"t{i}": (i + 1, 1.0) for i in range(5)}, {}, {}]}
    rep = tenant_backlog(depths, top=2)
    assert rep == {"sim@1": {"paid": {"t4": [5, 1.0], "t3": [4, 1.0], REST: [6, 3]}}}


def test_batcher_counts_live_requests_per_tenant() -> None:
    b = Batcher(policy=FlushPolicy(), cost=CostModel(), max_batch=lambda ref: 4, n_ranks=4)
    for i in range(6):
        p = pending(rank=1, at=0.0)
        p.msg.tenant_id = "noisy" if i < 5 else "quiet"
        b.add(p)
    assert b.depth_by_tenant()[("sim", "1")][1] == {"noisy": (5, 1.0), "quiet": (1, 1.0)}
    batch = b.take(1.0, lambda ref: True)
    assert batch is not None and len(batch.items) == 4
    left = b.depth_by_tenant()[("sim", "1")][1]
    assert left == {"noisy": (2, 1.0)}, "round robin served the quiet tenant in the first batch"
    assert BatchKey("sim", "1").ref in b.depth_by_tenant()


def test_recent_admissions_count_what_reports_do_not_show_yet() -> None:
    r = RecentAdmissions(horizon_s=5.0, bucket_s=0.1)
    for i in range(30):
        r.add("k", 10.0 + i * 0.05)  # 10.00 .. 11.45
    assert r.since("k", 9.0) == 30
    assert r.since("k", 11.0) == 10  # 11.00 .. 11.45
    assert r.since("other", 0.0) == 0
    r.add("k", 20.0)  # older buckets fall out of the horizon
    assert r.since("k", 0.0) == 1


def test_unreported_admissions_shed_a_burst_before_the_report_shows_it() -> None:
    v = view(100, {"quiet": [0, 1.0]})
    first = decide(v, "sim@1", "paid", utilization=1.0, thresholds_ms=THRESH, tenant="noisy")
    assert first.admit
    late = decide(
        v, "sim@1", "paid", utilization=1.0, thresholds_ms=THRESH, tenant="noisy", admitted=80
    )
    assert not late.admit and late.predicted_delay_s == pytest.approx(80 / 100)
    # the quiet tenant is not charged for the noisy one's unreported requests
    assert decide(v, "sim@1", "paid", utilization=1.0, thresholds_ms=THRESH, tenant="quiet").admit


def test_own_queue_now_adds_admissions_and_drains_its_share() -> None:
    # alone in the class: drains at the whole usable capacity for the report's age
    assert own_queue_now(100, 100, 50, 0.5, 100) == pytest.approx(100 + 50 - 50)
    # half the class's queue: half the capacity
    assert own_queue_now(100, 200, 0, 0.5, 100) == pytest.approx(75)
    # nothing reported yet: only what was admitted since counts
    assert own_queue_now(0, 500, 30, 1.0, 100) == 30
    assert own_queue_now(10, 10, 0, 5.0, 100) == 0  # never negative


def test_a_stale_report_of_a_draining_backlog_does_not_shed_forever() -> None:
    v = view(100, {"noisy": [60, 1.0]})
    fresh = decide(
        v, "sim@1", "paid", utilization=1.0, thresholds_ms=THRESH, tenant="noisy", admitted=10
    )
    assert not fresh.admit and fresh.predicted_delay_s == pytest.approx(0.70)
    # half a second later, 50 of those 70 have been served
    aged = decide(
        v,
        "sim@1",
        "paid",
        utilization=1.0,
        thresholds_ms=THRESH,
        tenant="noisy",
        admitted=10,
        age_s=0.5,
    )
    assert aged.admit and aged.predicted_delay_s == pytest.approx(0.20)


def test_higher_classes_arriving_leave_less_capacity_to_drain_a_lower_one() -> None:
    v = LoadView({"sim@1": 200}, {"sim@1": {"free": 30}}, {})
    alone = decide(v, "sim@1", "free", utilization=0.75, thresholds_ms=THRESH, tenant="f")
    assert alone.admit  # 30 / 150 = 0.2 s
    busy = decide(
        v, "sim@1", "free", utilization=0.75, thresholds_ms=THRESH, tenant="f", higher_rate=120
    )
    assert not busy.admit and busy.predicted_delay_s == pytest.approx(30 / 30)
    full = decide(
        v, "sim@1", "free", utilization=0.75, thresholds_ms=THRESH, tenant="f", higher_rate=150
    )
    assert not full.admit  # nothing left for free traffic at all
