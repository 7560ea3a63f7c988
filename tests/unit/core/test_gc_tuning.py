"""The request path's collector settings (core/gc_tuning.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from core.gc_tuning import GEN0_THRESHOLD, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


@pytest.mark.usefixtures("restored_gc")
def test_start_up_objects_are_frozen_and_young_collections_are_rarer() -> None:
    _, gen1, gen2 = gc.get_threshold()
    tune_gc()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (GEN0_THRESHOLD, gen1, gen2)
    assert GEN0_THRESHOLD > 700  # CPython's default
