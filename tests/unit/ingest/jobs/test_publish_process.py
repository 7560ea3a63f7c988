"""A new job's staged file, handed to a publishing process (decision 74): reopened by
path, it reads back as the same items, and one that has no path is kept in-process."""

from __future__ import annotations

import io
import itertools
import multiprocessing
import pickle
import time
from concurrent.futures import ProcessPoolExecutor

import orjson

from core.config import Settings
from gristmill.devservices.ports import free_port
from ingest.jobs.pacing import Pacer
from ingest.jobs.publish_process import LAG_MIRROR_S, PublishProcess, StagedRef
from ingest.jobs.upload import Item, Staged
from tests.unit.ingest.jobs.test_upload import stager


def staged_job(n: int) -> Staged:
    s = stager()
    s.feed(b"".join(orjson.dumps({"input": f"text {i}\t{i}"}) + b"\n" for i in range(n)))
    return s.finish()


def items(staged: Staged, page: int = 256) -> list[Item]:
    return [item for p in staged.pages(page) for item in p]


def read_back(ref: StagedRef) -> list[Item]:
    opened = ref.open()
    try:
        return items(opened)
    finally:
        opened.close()


def test_a_reopened_staged_file_reads_back_the_same_items() -> None:
    staged = staged_job(300)
    ref = StagedRef.of(staged)
    assert ref is not None and ref.count == 300
    assert read_back(pickle.loads(pickle.dumps(ref))) == items(staged)
    # The reopened file has its own offset: the API's copy still reads from the start.
    assert items(staged) == read_back(ref)


def test_another_process_reads_the_unnamed_file() -> None:
    staged = staged_job(50)
    ref = StagedRef.of(staged)
    assert ref is not None
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx) as pool:
        assert pool.submit(read_back, ref).result(timeout=60) == items(staged)


def test_a_staged_object_without_a_file_descriptor_has_no_reference() -> None:
    staged = Staged(io.BytesIO(b""), 0, "")  # type: ignore[arg-type]
    assert StagedRef.of(staged) is None


def test_reused_items_stay_left_out() -> None:
    staged = staged_job(10)
    staged = Staged(staged.file, staged.count, staged.body_hash, frozenset({1, 3}))
    ref = StagedRef.of(staged)
    assert ref is not None
    assert [i for i, *_ in read_back(ref)] == [0, 2, 4, 5, 6, 7, 8, 9]


def test_a_paced_child_sees_its_api_process_lag_until_it_is_closed() -> None:
    """The child paces by the lag its API process mirrors into shared memory."""
    lags = iter(itertools.chain([40.0, 80.0], itertools.repeat(120.0)))
    pacer = Pacer(lambda: next(lags), target_ms=25.0)
    closed_port = f"127.0.0.1:{free_port()}"
    settings = Settings(
        kafka_bootstrap=closed_port,
        database_url=f"postgresql+psycopg://gm@{closed_port}/gm",
    )
    child = PublishProcess(settings, pacer)
    held = child.submit("not-a-job", None)  # starts the child
    try:
        deadline = time.monotonic() + 10
        while child._lag.value != 120.0:
            assert time.monotonic() < deadline, "the lag was never mirrored"
            time.sleep(0.01)
    finally:
        child.close()
    time.sleep(5 * LAG_MIRROR_S)
    child._lag.value = -1.0
    time.sleep(5 * LAG_MIRROR_S)
    assert child._lag.value == -1.0  # closed: nothing writes it any more
    # What the child held when it was closed is settled, not left waiting.
    assert held.exception(timeout=10) is not None


def test_an_unpaced_child_shares_no_lag() -> None:
    settings = Settings(kafka_bootstrap=f"127.0.0.1:{free_port()}")
    child = PublishProcess(settings)
    held = child.submit("not-a-job", None)
    try:
        assert child._lag is None
    finally:
        child.close()
    assert held.exception(timeout=10) is not None
