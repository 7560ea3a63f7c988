"""Which versions a worker holds within its memory budget (scheduler/core/residency.py)."""

from __future__ import annotations

from core.vocab import ModelRef
from scheduler.core.residency import FAILED_RETRY_S, Rank, Resident, Want, WorkerView, plan

A, B, C = ModelRef("m", "1"), ModelRef("m", "2"), ModelRef("m", "3")
MB = 1_000_000
MIN_S = 30.0


def res(ref: ModelRef, mb: int, loaded_at: float, used: float, busy: bool = False) -> Resident:
    return Resident(ref, mb * MB, loaded_at, used, busy)


def test_a_wanted_version_that_fits_is_loaded_best_rank_first() -> None:
    view = WorkerView(budget=0)
    p = plan(view, [Want(B, Rank.SPARE), Want(A, Rank.REQUIRED)], now=0, min_residency_s=MIN_S)
    assert p.load == A and p.unload == ()


def test_one_load_at_a_time() -> None:
    view = WorkerView(budget=0, loading=Want(A, Rank.REQUIRED))
    assert plan(view, [Want(A, Rank.REQUIRED), Want(B, Rank.REQUIRED)], 0, MIN_S).load is None


def test_the_least_recently_used_makes_room_once_past_its_residency() -> None:
    view = WorkerView(
        budget=100 * MB,
        resident={A: res(A, 60, loaded_at=0, used=50), B: res(B, 30, loaded_at=0, used=10)},
    )
    wants = [Want(A, Rank.DEMANDED), Want(B, Rank.DEMANDED), Want(C, Rank.DEMANDED, 40 * MB)]
    p = plan(view, wants, now=100, min_residency_s=MIN_S)
    assert p.load == C and p.unload == (B,)  # B: used longest ago; frees enough


def test_nothing_is_unloaded_for_room_within_its_minimum_residency() -> None:
    view = WorkerView(budget=100 * MB, resident={A: res(A, 80, loaded_at=90, used=95)})
    wants = [Want(A, Rank.DEMANDED), Want(B, Rank.DEMANDED, 40 * MB)]
    p = plan(view, wants, now=100, min_residency_s=MIN_S)
    assert p.load is None and p.unload == () and p.why == "no room"
    later = plan(view, wants, now=121, min_residency_s=MIN_S)
    assert later.load == B and later.unload == (A,)


def test_a_version_with_batches_on_the_worker_is_never_unloaded() -> None:
    view = WorkerView(budget=100 * MB, resident={A: res(A, 80, 0, 0, busy=True)})
    p = plan(view, [Want(A, Rank.DEMANDED), Want(B, Rank.DEMANDED, 40 * MB)], 100, MIN_S)
    assert p.load is None and p.unload == ()


def test_a_lower_rank_never_unloads_a_better_one() -> None:
    view = WorkerView(budget=100 * MB, resident={A: res(A, 80, 0, 0)})
    wants = [Want(A, Rank.REQUIRED), Want(B, Rank.DEMANDED, 40 * MB)]
    assert plan(view, wants, 1000, MIN_S).load is None


def test_a_better_rank_unloads_a_worse_one() -> None:
    view = WorkerView(budget=100 * MB, resident={A: res(A, 80, 0, 0)})
    wants = [Want(A, Rank.SPARE), Want(B, Rank.REQUIRED, 40 * MB)]
    p = plan(view, wants, 1000, MIN_S)
    assert p.load == B and p.unload == (A,)


def test_spare_versions_only_go_into_free_room() -> None:
    view = WorkerView(budget=100 * MB, resident={A: res(A, 80, 0, 0)})
    wants = [Want(A, Rank.SPARE), Want(B, Rank.SPARE, 40 * MB)]
    assert plan(view, wants, 1000, MIN_S).load is None
    roomy = WorkerView(budget=200 * MB, resident={A: res(A, 80, 0, 0)})
    assert plan(roomy, wants, 1000, MIN_S).load == B


def test_a_version_nobody_wants_is_unloaded_at_once_when_idle() -> None:
    view = WorkerView(
        budget=0, resident={A: res(A, 10, loaded_at=99, used=99), B: res(B, 10, 0, 0, busy=True)}
    )
    p = plan(view, [], now=100, min_residency_s=MIN_S)
    assert p.unload == (A,)  # B drains first: its batches are still on the worker


def test_a_failed_load_waits_before_it_is_tried_again() -> None:
    view = WorkerView(budget=0, failed_at={A: 100.0})
    assert plan(view, [Want(A, Rank.REQUIRED)], 110, MIN_S).load is None
    assert plan(view, [Want(A, Rank.REQUIRED)], 100 + FAILED_RETRY_S, MIN_S).load == A
