"""Admission per tenant inside a class: the tenant that owns a backlog is shed first."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.load_report import REST, LoadReport
from ingest.admission.capacity import RecentAdmissions
from ingest.admission.view import LoadView, own_queue_now, share_ahead
from scheduler.core.batcher import Batcher, BatchKey, FlushPolicy
from scheduler.core.costmodel import CostModel
from scheduler.core.load_report import tenant_backlog
from tests.unit.helpers import pending


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


def test_rates_count_over_the_horizon_and_are_not_diluted_at_start() -> None:
    r = RecentAdmissions(horizon_s=5.0, bucket_s=0.1)
    for i in range(10):
        r.add("k", 100.0 + i * 0.01)  # 10 events in the first 0.1 s of counting
    assert r.rate("k", 100.1) == pytest.approx(100.0)  # not 10 / 5 s
    for i in range(1000):
        r.add("k", 100.1 + i * 0.01)  # 100/s for 10 s
    assert r.rate("k", 110.1) == pytest.approx(100.0, rel=0.03)
    assert r.rate("k", 200.0) == 0.0  # all fell out


def test_own_queue_now_adds_admissions_and_drains_its_share() -> None:
    # alone in the class: drains at the whole usable capacity for the report's age
    assert own_queue_now(100, 100, 50, 0.5, 100) == pytest.approx(100 + 50 - 50)
    # half the class's queue: half the capacity
    assert own_queue_now(100, 200, 0, 0.5, 100) == pytest.approx(75)
    # nothing reported yet: only what was admitted since counts
    assert own_queue_now(0, 500, 30, 1.0, 100) == 30
    assert own_queue_now(10, 10, 0, 5.0, 100) == 0  # never negative
