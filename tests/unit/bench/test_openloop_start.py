"""The open-loop generator's start: the shared schedule begins once every child is
ready, however long a child's setup takes, and a run against a loopback server gets
every answer back, each checked, with the worst send of each second recorded."""

from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import threading
import time
from collections.abc import Iterator

import orjson
import pytest

from bench.openloop import START_LEAD_S, LoadSpec, StartGate, percentile, run_load
from core.models.sim import sim_output


def _slow_child(gate: StartGate, delay_s: float, out: object) -> None:
    time.sleep(delay_s)  # a child still importing, reading its corpus
    ready_at = time.monotonic()
    start = gate.wait()
    out.put((ready_at, start))  # type: ignore[attr-defined]


def test_the_schedule_starts_after_the_slowest_child_is_ready() -> None:
    ctx = mp.get_context("spawn")
    gate = StartGate(ctx, 2)
    out = ctx.Queue()
    procs = [ctx.Process(target=_slow_child, args=(gate, d, out)) for d in (0.0, 1.5)]
    for p in procs:
        p.start()
    start = gate.open([])
    got = [out.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(10)
    assert {s for _, s in got} == {start}  # one schedule for every child
    assert start >= max(ready for ready, _ in got) + START_LEAD_S * 0.99


class _SimServer:
    """An HTTP/1.1 server on loopback that answers ``/v1/infer`` as ``sim`` would."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.port = 0
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        started.wait(10)

    def _run(self, started: threading.Event) -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                    text = orjson.loads(await reader.readexactly(length))["input"]
                    body = orjson.dumps({"output": sim_output(text)})
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
                    )
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()

        async def serve() -> None:
            server = await asyncio.start_server(handle, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            started.set()
            await asyncio.Event().wait()

        self.loop.run_until_complete(serve())


@pytest.fixture(scope="module")
def sim_server() -> Iterator[_SimServer]:
    yield _SimServer()


def test_a_run_gets_every_answer_and_records_lateness_by_second(sim_server: _SimServer) -> None:
    spec = LoadSpec(
        url=f"http://127.0.0.1:{sim_server.port}/v1/infer",
        headers={},
        rate=100,
        duration_s=2,
        tag="gate",
        client="raw",
    )
    got = run_load(spec, processes=2).summary()
    assert got["statuses"] == {"200": 200}
    assert got["wrong_outputs"] == 0
    assert len(got["send_lag_worst_by_s_ms"]) == 3  # seconds 0, 1 and the last send's
    assert all(v >= 0 for v in got["send_lag_worst_by_s_ms"])
    # Every request counted in the second it was due: 100 in each of the two.
    assert got["ok_by_s"][:2] == [100, 100] and sum(got["ok_by_s"]) == 200
    assert sum(got["failed_by_s"]) == 0


def test_the_one_percentile_is_nearest_rank_and_nan_for_nothing() -> None:
    assert math.isnan(percentile([], 50))
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(x) for x in range(101)], 95) == 95.0
    assert percentile([5.0], 99) == 5.0
    assert percentile([1.0, 2.0], 100) == 2.0 and percentile([1.0, 2.0], 0) == 1.0
