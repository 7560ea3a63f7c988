"""The soak's memory verdict (bench/steady/soak.py ``memory_check``): pure, on samples
shaped as the soak records them."""

from __future__ import annotations

from typing import Any

from bench.steady.soak import memory_check


def samples(
    uss: dict[str, list[float]], t0: float = 0.0, spawned: tuple[str, ...] = ("api/1", "api/2")
) -> list[dict[str, Any]]:
    """Samples every 10 s from ``t0``; ``spawned``: children multiprocessing spawned."""
    n = len(next(iter(uss.values())))

    def entry(name: str, mb: float) -> dict[str, Any]:
        e: dict[str, Any] = {"uss_mb": mb, "rss_mb": mb}
        if name in spawned:
            e["spawned"] = True
        return e

    return [
        {"t": t0 + 10 * i, "processes": {k: entry(k, v[i]) for k, v in uss.items()}}
        for i in range(n)
    ]


def test_a_flat_process_passes_and_a_growing_one_fails() -> None:
    early = samples({"scheduler": [100, 100, 100], "kafka0": [700, 700, 700]})
    late = samples({"scheduler": [101, 101, 101], "kafka0": [760, 760, 760]}, 3600)
    got = memory_check(early, late, 4.0)
    assert got["processes"]["scheduler"]["ok"] and not got["processes"]["kafka0"]["ok"]
    assert not got["ok"]


def test_an_api_process_whose_first_upload_came_late_is_judged_by_its_replicas() -> None:
    # api/2 took its first upload after the warm-up: it climbs to where api/1 already was.
    early = samples({"api/1": [98.6, 98.6, 98.6], "api/2": [81.8, 81.8, 81.8]})
    late = samples({"api/1": [100.0, 100.0, 100.0], "api/2": [97.6, 97.7, 97.7]}, 3600)
    got = memory_check(early, late, None)
    assert got["ok"]
    assert got["processes"]["api/2"]["replicas_warm_mb"] == 98.6


def test_an_api_process_that_passes_its_replicas_level_fails() -> None:
    early = samples({"api/1": [98.6, 98.6, 98.6], "api/2": [81.8, 81.8, 81.8]})
    late = samples({"api/1": [100.0, 100.0, 100.0], "api/2": [120.0, 120.0, 120.0]}, 3600)
    got = memory_check(early, late, None)
    assert not got["processes"]["api/2"]["ok"] and not got["ok"]


def test_a_helper_of_the_api_is_no_replica() -> None:
    # multiprocessing's resource tracker is a child of the API's root, not a server.
    early = samples({"api/1": [98.6] * 3, "api/9": [5.7] * 3})
    late = samples({"api/1": [98.6] * 3, "api/9": [8.0] * 3}, 3600)
    got = memory_check(early, late, None)["processes"]["api/9"]
    assert not got["ok"] and "replicas_warm_mb" not in got


def test_processes_that_are_not_replicas_keep_their_own_level() -> None:
    # Two schedulers' workers are not the API's replicas: each against its own warm-up.
    early = samples({"scheduler/1": [25.0] * 3, "scheduler/2": [40.0] * 3})
    late = samples({"scheduler/1": [35.0] * 3, "scheduler/2": [40.0] * 3}, 3600)
    assert not memory_check(early, late, None)["processes"]["scheduler/1"]["ok"]


def test_a_postgres_backend_may_move_by_work_mem() -> None:
    early = samples({"postgres/7": [4.1] * 3, "postgres": [10.7] * 3})
    late = samples({"postgres/7": [6.1] * 3, "postgres": [12.5] * 3}, 3600)
    got = memory_check(early, late, 4.0)
    assert got["processes"]["postgres/7"] == {
        "warm_mb": 4.1,
        "end_mb": 6.1,
        "growth": 0.4878,
        "ok": True,
        "floor_mb": 4.0,
    }
    assert not got["processes"]["postgres"]["ok"]  # the postmaster is no backend
    assert not memory_check(early, late, None)["processes"]["postgres/7"]["ok"]


def test_no_samples_is_no_pass() -> None:
    assert not memory_check([], [], 4.0)["ok"]
