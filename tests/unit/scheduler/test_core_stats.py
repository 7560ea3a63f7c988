"""The dispatch core's interface and its stats snapshot (scheduler/core/interface.py,
scheduler/core/stats.py): what observers read instead of the core's fields."""

from __future__ import annotations

from core.protocol import ModelInfo, WorkResult
from core.vocab import ModelRef
from scheduler.core.batcher import BatchKey, FlushPolicy, Sizing
from scheduler.core.interface import SchedulerInterface
from scheduler.core.plans import DEFAULT_CLASS
from tests.unit.helpers import pending
from tests.unit.scheduler.test_dispatch_core import make_core

KEY = BatchKey("sim", "1")
REF = ModelRef("sim", "1")
TP = ("t", 0)


def test_the_core_answers_its_interface() -> None:
    core: SchedulerInterface = make_core()  # mypy checks the protocol here
    assert callable(core.make_stats) and callable(core.worker_stats)


def test_a_snapshot_shows_queues_workers_and_the_oldest_request_anywhere() -> None:
    core = make_core()
    w = core.add_worker("w1", [ModelInfo("sim", "1", 2, {1: 10.0, 2: 10.0})])
    items = [pending(key=KEY, rank=1, at=float(i), offset=i) for i in range(5)]
    core.accept(items, [], {TP})
    step = core.schedule(w, 10.0)  # a full batch of two leaves: the oldest are on w
    assert step.start is not None
    st = core.make_stats(10.0)
    assert st.queued[(REF, 1)] == 3 and st.counts["consumed"] == 5
    assert st.oldest[(REF, 1)] == 0.0  # on the worker, not in the batcher: still counted
    (ws,) = st.workers
    assert (ws.worker_id, ws.in_flight, ws.busy, ws.serving) == ("w1", 1, {REF}, {REF})
    assert ws.used_at[REF] == 10.0 and REF in st.sized
    assert core.demanded() == {REF}


def test_a_batch_is_awaited_only_once_sent() -> None:
    core = make_core()
    w = core.add_worker("w1", [ModelInfo("sim", "1", 2, {1: 10.0, 2: 10.0})])
    core.accept([pending(key=KEY, rank=1, offset=i) for i in range(2)], [], {TP})
    entry = core.schedule(w, 1.0).start
    assert entry is not None and core.awaiting(w) is None
    core.sent(w, entry)
    assert core.awaiting(w) is entry
    res = WorkResult(entry.batch.batch_id, ["a", "b"], None, 1.0, 1.01)
    assert core.on_result(w, entry, res, 1.02) and core.awaiting(w) is None
    assert core.worker_stats(w).in_flight == 0


def test_limits_are_a_live_read_only_view() -> None:
    core = make_core()
    limits = core.batch_limits()
    core.add_worker("w1", [ModelInfo("sim", "1", 8, {1: 10.0})])
    assert limits[REF] == 8


def test_each_worker_class_sizes_its_own_batches() -> None:
    """A GPU worker's batches follow the GPU curve and limit, a CPU worker's its own;
    each call says which (no curve is swapped into the batcher between calls)."""
    core = make_core()
    cpu = core.add_worker("cpu", [ModelInfo("sim", "1", 4, {1: 10.0, 4: 40.0})])
    gpu = core.add_worker("gpu", [ModelInfo("sim", "1", 64, {1: 2.0, 64: 8.0})], "gpu")
    assert cpu.worker_class == DEFAULT_CLASS
    core.accept([pending(key=KEY, rank=1, offset=i) for i in range(100)], [], {TP})
    big = core.schedule(gpu, 1.0).start
    held = core.schedule(cpu, 1.0)  # saturated: its start is staggered from the GPU's
    small = core.schedule(cpu, held.wait_until).start
    assert big is not None and small is not None
    assert len(big.batch.items) == 64 and len(small.batch.items) == 4
    gpu_sizing = core.sizing("gpu")
    assert isinstance(gpu_sizing, Sizing) and gpu_sizing.max_batch(REF) == 64
    assert core.batcher.limit(REF) == core.sizing(DEFAULT_CLASS).limit(REF)
    assert isinstance(core.batcher.policy, FlushPolicy)
