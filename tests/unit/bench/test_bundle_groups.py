"""bench/gpuhost/bundle.py's grouping: every part once, each group within the budget."""

from __future__ import annotations

import random

import pytest

from bench.gpuhost.bundle import MIB, group_parts


def test_the_parts_fit_in_four_calls_beside_a_17_mib_tree() -> None:
    sizes = {"jre": 17.4, "kafka": 30.0, "pg": 20.5, "site": 24.4, "model": 44.0}  # MiB
    budget = int((64 - 17 - 1) * MIB)
    groups = group_parts({k: int(v * MIB) for k, v in sizes.items()}, budget)
    assert sorted(n for g in groups for n in g) == sorted(sizes)
    assert len(groups) == 4
    assert groups[0][0] == "jre"  # the runtime comes first: the broker can be checked early


def test_random_parts_are_each_placed_once_within_the_budget() -> None:
    rng = random.Random(7)
    for _ in range(200):
        budget = rng.randint(10, 60) * MIB
        sizes = {f"p{i}": rng.randint(1, budget) for i in range(rng.randint(1, 8))}
        groups = group_parts(sizes, budget)
        assert sorted(n for g in groups for n in g) == sorted(sizes)
        assert all(sum(sizes[n] for n in g) <= budget for g in groups)


def test_a_part_larger_than_a_call_is_named() -> None:
    with pytest.raises(SystemExit, match="model"):
        group_parts({"model": 70 * MIB}, 40 * MIB)
