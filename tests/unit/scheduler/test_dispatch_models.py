"""The dispatch core with several versions and worker classes: a batch a worker could not
run through no fault of its inputs goes back unchanged, the served set follows the model
control, and each worker class keeps its own cost curve (heterogeneous pools)."""

from __future__ import annotations

import pytest

from core.protocol import ModelInfo, WorkResult
from core.vocab import ModelRef
from tests.unit.scheduler.test_dispatch_core import KEY, REF, item, make_core, ok, queue, started


def info(size: int, ms: float, version: str = "1") -> ModelInfo:
    return ModelInfo("sim", version, size, {1: ms, size: ms})


def test_an_unavailable_result_hands_the_batch_back_without_an_attempt() -> None:
    core = make_core()
    w = core.add_worker("w", [info(4, 10.0)])
    queue(core, *[item(at=0.0, offset=i) for i in range(4)])
    entry = started(core, w, 0.0)
    down = WorkResult(entry.batch.batch_id, None, "upstream down", 0.0, 0.01, unavailable=True)
    assert core.on_result(w, entry, down, 0.01) == []
    assert REF not in w.refs  # no more of it here until the model control says ready
    assert core.stats["handed_back"] == 4 and core.stats["failed"] == 0
    assert len(core.batcher) == 4
    assert all(p.msg.attempt == 0 for q in [core.batcher] for p in entry.batch.items)
    # Another worker that serves it takes the same items.
    other = core.add_worker("v", [info(4, 10.0)])
    again = started(core, other, 0.02)
    assert sorted(p.offset for p in again.batch.items) == [0, 1, 2, 3]


def test_the_served_set_follows_the_model_control() -> None:
    core = make_core()
    w = core.add_worker("w", [])
    queue(core, item(at=0.0))
    assert core.schedule(w, 1.0).start is None  # serves nothing yet
    core.set_served(w, [info(4, 10.0)])
    assert w.refs == {REF} and core.schedule(w, 1.0).start is not None
    core.set_served(w, [])
    assert w.refs == frozenset()


def test_each_worker_class_has_its_own_curve() -> None:
    core = make_core()
    cpu = core.add_worker("c", [info(8, 80.0)], "cpu")
    gpu = core.add_worker("g", [info(8, 8.0)], "cuda")
    assert core.curve("cpu").predict_ms(REF, 8) == pytest.approx(80.0)
    assert core.curve("cuda").predict_ms(REF, 8) == pytest.approx(8.0)
    # A batch run on the GPU teaches the GPU's curve only.
    queue(core, *[item(at=0.0, offset=i) for i in range(8)])
    entry = started(core, gpu, 0.0)
    assert entry.predicted_s == pytest.approx(0.008)
    core.on_result(gpu, entry, ok(entry, 0.0, 0.012), 0.012)
    # A measured batch outweighs the warm-up reading (scheduler/core/costmodel.py).
    assert core.curve("cuda").predict_ms(REF, 8) == pytest.approx(12.0)
    assert core.curve("cpu").predict_ms(REF, 8) == pytest.approx(80.0)
    # Capacity counts each worker at its own class's speed: 8/0.08 + 8/0.012.
    cap = core.capacity()[f"{KEY.model}@{KEY.version}"]
    assert cap["items_s"] == pytest.approx(8 / 0.08 + 8 / 0.012, rel=0.01)
    assert cap["workers"] == 2
    assert cap["single_ms"] == pytest.approx(core.curve("cuda").predict_ms(REF, 1))
    assert set(core.class_curves()) == {(REF, "cpu"), (REF, "cuda")}
    _ = cpu


def test_batches_are_sized_for_the_worker_that_asks() -> None:
    core = make_core()
    small = core.add_worker("c", [info(2, 10.0)], "cpu")
    big = core.add_worker("g", [info(8, 10.0)], "cuda")
    queue(core, *[item(at=0.0, offset=i) for i in range(16)])
    assert len(started(core, big, 0.0).batch.items) == 8
    # The second worker may be held to stagger its start from the first's.
    hold = core.schedule(small, 0.0).wait_until or 0.0
    assert len(started(core, small, hold).batch.items) == 2
    assert ModelRef("sim", "1") == REF
