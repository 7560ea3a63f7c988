"""A new job's staged file, handed to a publishing process (decision 74): reopened by
path, it reads back as the same items, and one that has no path is kept in-process."""

from __future__ import annotations

import io
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import orjson

from ingest.jobs.publish_process import StagedRef
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
