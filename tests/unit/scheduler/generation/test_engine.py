"""The step loop: commands join between steps, events reach the sink in order."""

from __future__ import annotations

import queue
import threading
import time

from scheduler.core.generation.engine import Cancel, Command, Engine
from scheduler.core.generation.events import Event, Finished, Token
from scheduler.core.generation.sequence import FinishReason
from tests.unit.scheduler.generation.fake_model import FakeRunner, reference
from tests.unit.scheduler.generation.helpers import batcher, req


class SlowRunner(FakeRunner):
    """Takes a little time per step, so commands arrive while sequences run."""

    def execute(self, plan):  # type: ignore[no-untyped-def]
        time.sleep(0.002)
        return super().execute(plan)


def test_serve_runs_submissions_and_cancellations_to_the_end() -> None:
    b = batcher(num_blocks=64, block_size=4, max_model_len=64)
    engine = Engine(b, SlowRunner(64, 4))
    inbox: queue.Queue[Command] = queue.Queue()
    got: list[Event] = []
    lock = threading.Lock()

    def sink(events: list[Event]) -> None:
        with lock:
            got.extend(events)

    stop = threading.Event()
    t = threading.Thread(target=engine.serve, args=(inbox, sink, stop), daemon=True)
    t.start()
    reqs = [req(4, 30) for _ in range(4)]
    for r in reqs:
        inbox.put(r)
        time.sleep(0.01)  # they join a batch that is already running
    victim = req(4, 1000, ignore_eos=True)
    inbox.put(victim)
    time.sleep(0.05)
    inbox.put(Cancel(victim.seq_id))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with lock:
            if sum(isinstance(e, Finished) for e in got) == 5:
                break
        time.sleep(0.01)
    stop.set()
    t.join(timeout=5)
    assert not t.is_alive()
    done = {e.seq_id: e for e in got if isinstance(e, Finished)}
    for r in reqs:
        assert list(done[r.seq_id].token_ids) == reference(r.prompt, 30)
        idx = [e.index for e in got if isinstance(e, Token) and e.seq_id == r.seq_id]
        assert idx == list(range(30))
    assert done[victim.seq_id].reason is FinishReason.CANCELLED
    assert 0 < len(done[victim.seq_id].token_ids) < 1000
    assert b.pool.used == 0
    assert engine.last is not None and engine.last.kv_used == 0


def test_an_invalid_request_is_recorded_not_raised() -> None:
    engine = Engine(batcher(max_model_len=16), FakeRunner(64, 4))
    assert not engine.submit(req(20, 2))
    assert engine.rejected and "prompt is 20 tokens" in engine.rejected[0][1]
