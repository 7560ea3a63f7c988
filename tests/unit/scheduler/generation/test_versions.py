"""Which generation versions the worker holds (scheduler/core/generation/versions.py), and
a step split by version for the worker (scheduler/runtime/generation/engine.py)."""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import pytest

from core.generation import Chunk, SampleSpec, StepOutput, StepPlan
from core.models.registry import LM_MAX_RUNNING, Backend, VersionRecord, VersionState
from core.protocol import (
    GenerationInfo,
    GenStep,
    GenStepResult,
    LoadModel,
    ModelInfo,
    ModelState,
    ModelStatus,
    UnloadModel,
)
from scheduler.core.generation.engine import PartFailed, StepFailed
from scheduler.core.generation.versions import RETRY_FAILED_S, Fate, Versions
from scheduler.runtime.generation.engine import WorkerRunner

NAME = "gristmill-lm"
POOL = GenerationInfo(num_blocks=100, block_size=16, max_model_len=512, max_step_tokens=256,
                      max_running=64)  # fmt: skip
S = VersionState


def rec(version: str, state: VersionState, **config: object) -> VersionRecord:
    return VersionRecord(NAME, version, Backend.CAUSAL_LM, LM_MAX_RUNNING, config, state=state)


def info(r: VersionRecord, pool: GenerationInfo = POOL) -> ModelInfo:
    return ModelInfo(r.name, r.version, r.max_batch_size, generation=pool, record=r)


def booted(*records: VersionRecord) -> Versions:
    """A worker that said hello holding version 1, the registry ``records``."""
    v = Versions(NAME, pool=POOL)
    v.on_hello([info(rec("1", S.LIVE))])
    v.set_registry(records)
    return v


def test_every_open_version_is_loaded_and_a_retired_one_unloaded() -> None:
    v1, v2, v3 = rec("1", S.LIVE), rec("2", S.CANARY, weights_seed=2), rec("3", S.STAGED)
    v = booted(v1, v2, v3, rec("4", S.RETIRED), replace(v1, name="sim"))
    cmds = v.tick(0.0, busy=())
    assert cmds == [LoadModel(v2), LoadModel(v3)]  # 1 is held; 4 retired; sim not ours
    assert v.tick(0.1, busy=()) == []  # loading already
    r = {x.version: x for x in v.readiness(alive=True)}
    assert (r["1"].ready, r["2"].loading, r["3"].loading) == (1, 1, 1)
    v.on_status(ModelStatus(NAME, "2", ModelState.READY, info(v2)), 1.0)
    assert v.ready("2") and not v.ready("3")
    assert [i.version for i in v.ready_infos()] == ["1", "2"]
    # 2 is retired while requests of it run: kept until they end, then unloaded.
    v.set_registry([v1, v3, replace(v2, state=S.RETIRED)])
    assert v.tick(2.0, busy={"2"}) == []
    assert v.tick(3.0, busy=()) == [UnloadModel(NAME, "2")]
    assert not v.ready("2") and v.known("2")


def test_a_failed_version_is_reported_and_tried_again_after_its_wait() -> None:
    v2 = rec("2", S.CANARY, weights_seed=2)
    v = booted(rec("1", S.LIVE), v2)
    assert v.tick(0.0, busy=()) == [LoadModel(v2)]
    v.on_status(ModelStatus(NAME, "2", ModelState.FAILED, error="sha256 mismatch"), 1.0)
    r = {x.version: x for x in v.readiness(alive=True)}
    assert r["2"].failed == 1 and r["2"].error == "sha256 mismatch" and r["2"].ready == 0
    assert v.tick(1.0 + RETRY_FAILED_S - 1, busy=()) == []
    assert v.tick(1.0 + RETRY_FAILED_S, busy=()) == [LoadModel(v2)]


def test_a_version_whose_pool_differs_cannot_run_under_the_policy() -> None:
    v2 = rec("2", S.STAGED, weights_seed=2)
    v = booted(rec("1", S.LIVE), v2)
    v.tick(0.0, busy=())
    smaller = replace(POOL, num_blocks=POOL.num_blocks - 1)
    v.on_status(ModelStatus(NAME, "2", ModelState.READY, info(v2, smaller)), 1.0)
    assert not v.ready("2")
    r = {x.version: x for x in v.readiness(alive=True)}
    assert r["2"].failed == 1 and "KV pool" in (r["2"].error or "")
    larger = replace(POOL, num_blocks=POOL.num_blocks * 2)  # room to spare is fine
    v.on_status(ModelStatus(NAME, "2", ModelState.READY, info(v2, larger)), 2.0)
    assert v.ready("2")


def test_without_a_worker_every_open_version_is_loading() -> None:
    v = booted(rec("1", S.LIVE), rec("2", S.CANARY), rec("3", S.RETIRED))
    assert [(x.version, x.loading, x.ready) for x in v.readiness(alive=False)] == [
        ("1", 1, 0),
        ("2", 1, 0),
    ]


def test_a_new_worker_holds_only_what_its_hello_names() -> None:
    v2 = rec("2", S.CANARY)
    v = booted(rec("1", S.LIVE), v2)
    v.on_status(ModelStatus(NAME, "2", ModelState.READY, info(v2)), 0.0)
    v.on_hello([info(rec("1", S.LIVE))])  # the worker was replaced
    assert not v.ready("2") and v.tick(1.0, busy={"2"}) == [LoadModel(v2)]


def test_a_boot_build_that_is_not_the_registrys_is_loaded_again_when_idle() -> None:
    v1 = rec("1", S.LIVE, context_length=512)  # the registry's differs from the boot one
    v = booted(v1)
    assert v.tick(0.0, busy={"1"}) == []  # not under running requests
    assert v.tick(1.0, busy=()) == [LoadModel(v1)]


def test_a_request_waiting_for_its_version_joins_fails_or_expires() -> None:
    v2, v3 = rec("2", S.CANARY), rec("3", S.STAGED)
    v = booted(rec("1", S.LIVE), v2, v3)
    v.tick(0.0, busy=())
    assert v.waiting_fate("2", deadline=10.0, now=5.0) is Fate.WAIT  # loading
    assert v.waiting_fate("2", deadline=10.0, now=11.0) is Fate.EXPIRE  # no first token
    v.on_status(ModelStatus(NAME, "2", ModelState.READY, info(v2)), 6.0)
    assert v.waiting_fate("2", deadline=10.0, now=11.0) is Fate.JOIN  # the policy decides
    v.on_status(ModelStatus(NAME, "3", ModelState.FAILED, error="bad weights"), 6.0)
    assert v.waiting_fate("3", deadline=10.0, now=5.0) is Fate.FAIL


class TwoVersionWorker:
    """A worker's socket: each GenStep answered in order by its version's 'model'."""

    worker_id = "w"

    def __init__(self, fail: str | None = None):
        self.sent: list[GenStep] = []
        self.unanswered: deque[GenStep] = deque()
        self.fail = fail

    def send(self, step: GenStep) -> None:
        self.sent.append(step)
        self.unanswered.append(step)

    def receive_step(self, timeout_s: float) -> GenStepResult:
        step = self.unanswered.popleft()
        if step.version == self.fail:
            return GenStepResult(step.batch_id, None, "boom", 0.0, 0.0)
        sampled = {c.seq_id: int(step.version) * 100 + len(c.tokens) for c in step.plan.chunks}
        return GenStepResult(step.batch_id, StepOutput(step.plan.step, sampled, 0.01), None, 0, 0)


def _plan() -> StepPlan:
    chunks = tuple(
        Chunk(seq, (1,) * n, 0, (i,), SampleSpec()) for i, (seq, n) in enumerate(
            [("a", 1), ("b", 2), ("c", 3)]
        )
    )  # fmt: skip
    return StepPlan(7, chunks, 16)


def test_a_step_goes_to_the_worker_as_one_genstep_per_version() -> None:
    worker = TwoVersionWorker()
    runner = WorkerRunner(worker, NAME, {"a": "1", "b": "2", "c": "1"})  # type: ignore[arg-type]
    out = runner.execute(_plan())
    assert [(s.version, [c.seq_id for c in s.plan.chunks]) for s in worker.sent] == [
        ("1", ["a", "c"]),
        ("2", ["b"]),
    ]
    assert all(s.plan.step == 7 and s.plan.block_size == 16 for s in worker.sent)
    assert dict(out.sampled) == {"a": 101, "b": 202, "c": 103}
    assert out.step == 7 and round(out.compute_s, 3) == 0.02


def test_a_versions_failed_part_fails_its_sequences_and_keeps_the_others_tokens() -> None:
    worker = TwoVersionWorker(fail="2")
    runner = WorkerRunner(worker, NAME, {"a": "1", "b": "2", "c": "1"})  # type: ignore[arg-type]
    with pytest.raises(PartFailed, match="gristmill-lm@2: boom") as e:
        runner.execute(_plan())
    assert e.value.seq_ids == {"b"} and dict(e.value.output.sampled) == {"a": 101, "c": 103}
    assert len(worker.sent) == 2 and not worker.unanswered  # the socket stays in step
    only = WorkerRunner(worker, NAME, {"a": "2", "b": "2", "c": "2"})  # type: ignore[arg-type]
    with pytest.raises(StepFailed, match="boom"):  # every part failed: the whole step
        only.execute(_plan())
