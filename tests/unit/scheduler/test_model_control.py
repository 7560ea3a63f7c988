"""The scheduler's model control (scheduler/core/model_control.py): registry records and worker
statuses in, load/unload commands and what the dispatch core may send out."""

from __future__ import annotations

import time

from core.config import Settings
from core.messages import RequestMessage
from core.models.registry import VersionRecord, VersionState
from core.protocol import LoadModel, ModelInfo, ModelState, ModelStatus
from core.vocab import PRIORITY_CLASSES, ModelRef
from scheduler.core.batcher import Batch, BatchKey, Pending
from scheduler.core.dispatch import DispatchCore
from scheduler.core.model_control import ModelControl
from scheduler.core.plans import InFlight

S = VersionState
M1, M2, M3 = ModelRef("m", "1"), ModelRef("m", "2"), ModelRef("m", "3")


class Handle:
    def __init__(self, wid: str = "w1"):
        self.worker_id = wid


def rec(version: str, state: VersionState, mb: int = 0, **config: object) -> VersionRecord:
    return VersionRecord(
        "m", version, "sim", 8, {"batch_ms": 10, **config}, state=state, memory_bytes=mb * 10**6
    )


def info(r: VersionRecord, mb: int = 0) -> ModelInfo:
    return ModelInfo(r.name, r.version, 8, {1: 10.0, 8: 10.0}, record=r, memory_bytes=mb * 10**6)


def setup(
    records: list[VersionRecord], budget_mb: int = 0, min_residency_s: float = 30.0
) -> tuple[ModelControl, DispatchCore, Handle]:
    core = DispatchCore.from_settings(Settings())
    ctl = ModelControl(Settings(model_min_residency_s=min_residency_s), ["m"], core)
    ctl.set_registry(records, {})
    h = Handle()
    w = core.add_worker(h.worker_id, [])
    ctl.add_worker(h, w, budget_mb * 10**6, ["m"], [], now=0.0)
    return ctl, core, h


def loads(cmds: list) -> list[str]:
    return [
        f"{'load' if isinstance(m, LoadModel) else 'unload'} "
        + (m.record.ref if isinstance(m, LoadModel) else f"{m.name}@{m.version}")
        for _, m in cmds
    ]


def ready(ctl: ModelControl, h: Handle, r: VersionRecord, now: float, mb: int = 0) -> list:
    ctl.on_status(h, ModelStatus(r.name, r.version, ModelState.READY, info(r, mb)), now)
    return ctl.tick(now)


def queue_item(core: DispatchCore, ref: ModelRef, i: int = 0) -> None:
    now = time.time()
    msg = RequestMessage(f"r{i}", "t", "paid", ref.model, ref.version, "x", {}, now + 60, now)
    p = Pending(
        msg, BatchKey(ref.model, ref.version, ()), PRIORITY_CLASSES.index("paid"), ("t", 0), i, now
    )
    core.accept([p], [], {("t", 0)})


def test_the_live_version_loads_first_then_staged_ones_where_room_is_free() -> None:
    v1, v2 = rec("1", S.LIVE), rec("2", S.STAGED)
    ctl, core, h = setup([v1, v2])
    assert loads(ctl.tick(0)) == ["load m@1"]
    ctl.on_status(h, ModelStatus("m", "1", ModelState.LOADING), 0)
    assert ctl.tick(0) == []  # one load at a time
    assert [r.loading for r in ctl.readiness()] == [1]
    assert loads(ready(ctl, h, v1, 1)) == ["load m@2"]
    assert core.workers[0].refs == {M1}
    ready(ctl, h, v2, 2)
    assert core.workers[0].refs == {M1, M2}
    assert {(r.version, r.ready) for r in ctl.readiness()} == {("1", 1), ("2", 1)}


def test_a_retired_version_drains_then_unloads() -> None:
    v1, v2 = rec("1", S.LIVE), rec("2", S.CANARY)
    ctl, core, h = setup([v1, v2])
    ctl.tick(0)
    ready(ctl, h, v1, 1)
    ready(ctl, h, v2, 2)
    w = core.workers[0]
    # A batch of m@2 is on the worker when it is retired.
    batch = Batch(BatchKey("m", "2", ()), [], 2.0, "full")
    w.queue.append(InFlight(batch, 0.01, sent=True))
    ctl.set_registry([v1, rec("2", S.RETIRED)], {})
    assert ctl.tick(3) == [] and w.refs == {M1}  # no new batch of it, not unloaded yet
    w.queue.clear()
    assert loads(ctl.tick(4)) == ["unload m@2"]
    ctl.on_status(h, ModelStatus("m", "2", ModelState.UNLOADED), 5)
    assert {r.version for r in ctl.readiness()} == {"1"}


def test_queued_requests_demand_their_version_even_past_spare_room() -> None:
    v1, v2 = rec("1", S.LIVE, mb=60), rec("2", S.STAGED, mb=60)
    ctl, core, h = setup([v1, v2], budget_mb=100, min_residency_s=0)
    ctl.tick(0)
    assert ready(ctl, h, v1, 1, mb=60) == []  # m@2 is spare: no room for it
    queue_item(core, M2)  # a pinned request or a replay
    core.set_served(core.workers[0], [])  # m@1 idle: nothing queued for it
    ctl.set_registry([rec("1", S.STAGED, mb=60), v2], {})  # m@1 no longer required
    assert loads(ctl.tick(2)) == ["unload m@1", "load m@2"]  # memory is freed first


def test_the_rollback_target_is_kept_warm() -> None:
    v1, v2 = rec("1", S.STAGED, mb=60), rec("2", S.LIVE, mb=60)
    ctl, _core, h = setup([v1, v2], budget_mb=150)
    ctl.set_registry([v1, v2], {"m": "1"})
    assert loads(ctl.tick(0)) == ["load m@2"]
    # m@1 is warm: it goes in after the live one, where a spare version would not.
    assert loads(ready(ctl, h, v2, 1, mb=60)) == ["load m@1"]


def test_a_failed_load_is_reported_and_not_retried_at_once() -> None:
    v1 = rec("1", S.LIVE)
    ctl, _core, h = setup([v1])
    ctl.tick(0)
    ctl.on_status(h, ModelStatus("m", "1", ModelState.FAILED, error="sha256 mismatch"), 1)
    assert ctl.tick(2) == []
    (r,) = ctl.readiness()
    assert (r.ready, r.failed, r.error) == (0, 1, "sha256 mismatch")


def test_an_unavailable_version_takes_no_batches_until_ready_again() -> None:
    v1 = rec("1", S.LIVE)
    ctl, core, h = setup([v1])
    ctl.tick(0)
    ready(ctl, h, v1, 1)
    ctl.on_status(
        h, ModelStatus("m", "1", ModelState.UNAVAILABLE, info(v1), "down", retry_after_s=4.0), 2
    )
    ctl.tick(2)
    assert core.workers[0].refs == frozenset()
    (r,) = ctl.readiness()
    assert (r.unavailable, r.retry_after_s, r.error) == (1, 4.0, "down")
    ready(ctl, h, v1, 3)
    assert core.workers[0].refs == {M1}


def test_a_boot_version_that_is_not_the_registrys_is_replaced() -> None:
    v1 = rec("1", S.LIVE, variant="new")
    ctl, core, h = setup([v1])
    booted = info(rec("1", S.LIVE))  # the built-in build, another variant
    ctl.on_status(h, ModelStatus("m", "1", ModelState.READY, booted), 0)
    assert loads(ctl.tick(0)) == ["load m@1"]
    assert core.workers[0].refs == frozenset()  # never served meanwhile


def test_specs_follow_the_registry() -> None:
    ctl, _core, _h = setup([rec("1", S.LIVE), rec("7", S.STAGED)])
    assert set(ctl.specs["m"]) == {"1", "7"}
