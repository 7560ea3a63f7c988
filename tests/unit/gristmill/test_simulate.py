"""The simulator itself: it loses nothing it admitted, follows worker loss, repeats
itself for a seed, and reads its command line."""

from __future__ import annotations

import pytest

from gristmill.simulate.cli import parse_burst, parse_curve, parse_mix
from gristmill.simulate.engine import simulate
from gristmill.simulate.scenario import CostCurve, Scenario, Stream, WorkerEvent

MIX = {"enterprise": 0.05, "paid": 0.25, "free": 0.70}


def streams(total: float, tenants: int = 2) -> list[Stream]:
    return [
        Stream(tier, f"{tier}-{i}", total * share / tenants)
        for tier, share in MIX.items()
        for i in range(tenants)
    ]


def test_every_admitted_request_is_answered_served_or_late() -> None:
    sc = Scenario(cost=CostCurve.flat(100, 10), streams=streams(600), workers=2, seconds=10)
    r = simulate(sc)
    for tier, s in r.tiers.items():
        assert s.offered == s.admitted + sum(s.refused.values()), tier
        assert s.admitted == s.served + s.late + s.expired + s.shed, tier
    assert r.tiers["free"].refused["capacity"] > 0  # 3x capacity: refusals happened


def test_a_lost_worker_halves_capacity_and_the_rest_stay_busy() -> None:
    sc = Scenario(
        cost=CostCurve.flat(100, 100),
        streams=streams(6000),
        workers=4,
        schedulers=2,
        api_instances=3,
        seconds=15,
        worker_events=[WorkerEvent(5.0, 0), WorkerEvent(5.0, 1), WorkerEvent(10.0, 0, "join")],
    )
    r = simulate(sc)
    assert r.lost_workers == [5.0, 5.0]
    assert r.busy() >= 0.9
    assert 0.6 < r.capacity_used() < 0.9  # a quarter and a half of the fleet gone a while
    assert r.order_violations == 0
    for s in r.tiers.values():
        assert s.admitted == s.served + s.late + s.expired + s.shed


def test_the_same_seed_gives_the_same_run() -> None:
    def once() -> dict[str, object]:
        sc = Scenario(cost=CostCurve.flat(20, 8), streams=streams(900), workers=2, seconds=5)
        return simulate(sc).summary()["tiers"]

    assert once() == once()


def test_the_curve_interpolates_and_the_fleet_capacity_follows_the_budget() -> None:
    c = CostCurve(((1, 10.0), (64, 200.0)), 256)
    assert c.ms(1) == 10.0 and c.ms(64) == 200.0
    assert c.ms(128) == pytest.approx(400.0)  # proportional past the last point
    sc = Scenario(cost=c, streams=[], workers=3)
    n = sc.batch_size()  # the most items/s within 465 ms
    assert c.ms(n) <= 465 < c.ms(n + 1)
    assert sc.usable_capacity() == pytest.approx(3 * n / (c.ms(n) / 1000))


def test_command_line_parts() -> None:
    assert parse_curve("1:14,16:105", 64).points == ((1, 14.0), (16, 105.0))
    assert parse_mix("paid=1,free=3") == {"paid": 0.25, "free": 0.75}
    b = parse_burst("paid:noisy:5000@10:2500")
    assert (b.tier, b.tenant, b.count, b.start_s, b.rate) == ("paid", "noisy", 5000, 10.0, 2500)
