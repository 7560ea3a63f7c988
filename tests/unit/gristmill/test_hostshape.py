"""The host shape: one worker per GPU, API processes for the rate the cores carry,
enough schedulers to feed each GPU, explicit counts kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from gristmill.cli.host import host_children
from gristmill.hostshape import HostCosts, partitions_for, shape_host


def test_a_gpu_host_gets_a_worker_per_gpu_and_feeders_for_each() -> None:
    s = shape_host(16, 1, colocated=True, reserve_cores=3)
    assert s.workers == 1
    assert s.schedulers == 6  # HostCosts.feeders_per_gpu
    assert 8 <= s.api_processes <= 12
    # The CPU the shape's processes use at the rate it carries fits in the host's cores.
    c = HostCosts()
    used = s.sync_capacity_rps * (c.api_ms + c.scheduler_ms + c.kafka_ms + c.postgres_ms) / 1000
    assert used + s.workers * c.worker_cores + 3 <= 16


def test_no_api_process_is_planned_busier_than_its_share_of_a_core() -> None:
    for cores, gpus in ((8, 1), (16, 1), (32, 2), (64, 4)):
        s = shape_host(cores, gpus, colocated=True)
        c = HostCosts()
        assert s.sync_capacity_rps * c.api_ms / 1000 <= s.api_processes * c.api_busy + 1e-9
    calm = shape_host(16, 1, HostCosts(api_busy=0.5))
    busy = shape_host(16, 1, HostCosts(api_busy=0.9))
    assert calm.api_processes > busy.api_processes


def test_more_cores_more_api_processes_and_never_fewer() -> None:
    counts = [shape_host(c, 1).api_processes for c in (4, 8, 16, 32, 64)]
    assert counts == sorted(counts)
    assert counts[-1] > counts[0]


def test_colocated_services_take_their_share_of_the_cores() -> None:
    alone = shape_host(16, 1)
    shared = shape_host(16, 1, colocated=True)
    assert shared.api_processes < alone.api_processes
    assert shared.sync_capacity_rps < alone.sync_capacity_rps


def test_several_gpus_get_several_workers_and_more_schedulers() -> None:
    one, four = shape_host(64, 1), shape_host(64, 4)
    assert (one.workers, four.workers) == (1, 4)
    assert four.schedulers >= 4 * HostCosts().feeders_per_gpu


def test_workers_sharing_a_gpu_are_counted_with_their_cores_and_dial_every_scheduler(
    tmp_path: Path,
) -> None:
    one, two = shape_host(16, 2), shape_host(16, 2, workers_per_gpu=2)
    assert (one.workers, two.workers) == (2, 4)
    assert two.api_processes <= one.api_processes  # two more workers' cores are taken
    assert any("2 per GPU" in r for r in two.reasons)
    _, workers, _ = host_children(two, ["0", "1"], models="m", run_dir=tmp_path, env={})
    devices = [w.env["CUDA_VISIBLE_DEVICES"] for w in workers]
    ids = [w.argv[w.argv.index("--worker-id") + 1] for w in workers]
    assert devices == ["0", "0", "1", "1"]
    assert ids == ["gpu0-0", "gpu0-1", "gpu1-0", "gpu1-1"]
    assert all(w.argv.count("--socket") == two.schedulers for w in workers)
    with pytest.raises(ValueError, match="workers_per_gpu"):
        shape_host(16, 1, workers_per_gpu=0)


def test_a_cpu_host_runs_cpu_workers() -> None:
    s = shape_host(2, 0, cpu_workers=2)
    assert s.workers == 2 and s.gpus == 0
    assert s.api_processes >= 1 and s.schedulers >= 1


def test_explicit_counts_are_kept_and_said() -> None:
    s = shape_host(16, 1, api_processes=3, schedulers=5)
    assert (s.api_processes, s.schedulers) == (3, 5)
    assert any("as asked" in r for r in s.reasons)


def test_cheaper_api_requests_need_fewer_api_processes_per_request() -> None:
    dear = shape_host(16, 1, HostCosts(api_ms=0.74))
    cheap = shape_host(16, 1, HostCosts(api_ms=0.25))
    assert cheap.sync_capacity_rps > dear.sync_capacity_rps
    assert (
        cheap.api_processes / cheap.sync_capacity_rps < dear.api_processes / dear.sync_capacity_rps
    )


def test_costs_from_a_measurement_file_are_checked() -> None:
    assert HostCosts.from_dict({"api_ms": 0.3}).api_ms == 0.3
    with pytest.raises(ValueError, match="unknown cost fields: apims"):
        HostCosts.from_dict({"apims": 0.3})
    with pytest.raises(ValueError, match="api_ms must be positive"):
        HostCosts.from_dict({"api_ms": 0})
    with pytest.raises(ValueError, match="api_busy is a share of one core"):
        HostCosts.from_dict({"api_busy": 1.5})


@pytest.mark.parametrize(
    ("schedulers", "minimum", "expected"), [(1, 3, 3), (3, 6, 6), (4, 6, 8), (5, 3, 5)]
)
def test_partitions_are_a_multiple_of_the_schedulers(
    schedulers: int, minimum: int, expected: int
) -> None:
    assert partitions_for(schedulers, minimum) == expected
    assert partitions_for(schedulers, minimum) % schedulers == 0


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        shape_host(0, 1)
    with pytest.raises(ValueError):
        shape_host(4, -1)
    with pytest.raises(ValueError):
        shape_host(4, 1, utilization=0)
