"""Staging uploads: the JSONL splitter, COPY escaping, item validation (pure, no services)."""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import InvalidInput, PayloadTooLarge, RequestTimeout, SchemaViolation
from core.messages import job_item_request_ids
from core.models.sim import SimSpec
from ingest.jobs.upload import ItemStager, LineSplitter, body_chunks, copy_text, copy_unescape

SPEC = SimSpec(name="sim", version="1", max_batch_size=100)


def split_all(data: bytes, sizes: list[int], max_line: int = 1 << 30) -> list[bytes]:
    s = LineSplitter(max_line)
    out: list[bytes] = []
    pos = 0
    for n in sizes:
        out += s.feed(data[pos : pos + n])
        pos += n
    out += s.feed(data[pos:])
    last = s.finish()
    return out + ([last] if last is not None else [])


@given(st.binary(max_size=300), st.lists(st.integers(min_value=0, max_value=40), max_size=30))
def test_splitting_any_chunking_gives_the_lines(data: bytes, sizes: list[int]) -> None:
    expected = data.split(b"\n")
    if expected[-1] == b"":
        expected.pop()
    assert split_all(data, sizes) == expected


def test_a_line_over_the_cap_is_refused_naming_it_before_it_is_held() -> None:
    s = LineSplitter(max_line=10)
    assert s.feed(b"short\nalso short\n") == [b"short", b"also short"]
    s.feed(b"0123456")
    with pytest.raises(PayloadTooLarge) as e:
        s.feed(b"789abc")  # the third line passes 10 bytes while still unfinished
    assert e.value.field == "line 3"


def _time_split(data: bytes, chunk: int) -> float:
    s = LineSplitter(max_line=2 << 20)
    t0 = time.perf_counter()
    for i in range(0, len(data), chunk):
        s.feed(data[i : i + chunk])
    s.finish()
    return time.perf_counter() - t0


@pytest.mark.parametrize("line_bytes", [1 << 20, 16])  # long lines; many tiny lines
def test_splitting_is_linear_in_the_body_size(line_bytes: int) -> None:
    line = b"x" * (line_bytes - 1) + b"\n"
    small = line * ((10 << 20) // line_bytes)  # 10 MB
    big = line * ((50 << 20) // line_bytes)  # 50 MB
    t_small = min(_time_split(small, 65536) for _ in range(5))
    t_big = min(_time_split(big, 65536) for _ in range(3))
    # Linear: 5x the bytes takes about 5x the time (quadratic would be 25x). The
    # bound leaves room for a busy machine.
    assert t_big / t_small < 12, (t_small, t_big)


def test_copy_text_escapes_what_copy_reads_specially() -> None:
    assert copy_text("plain") == "plain"
    assert copy_text("a\\b\tc\nd\re") == "a\\\\b\\tc\\nd\\re"
    assert copy_text('{"x": "\\n"}') == '{"x": "\\\\n"}'  # JSON's own escapes survive


def stager(max_items: int = 1000, tmp: str = "") -> ItemStager:
    return ItemStager(
        "00000000-0000-0000-0000-000000000001",
        SPEC,
        max_items=max_items,
        max_line=1 << 20,
        max_depth=32,
        folder=tmp,
        scope=b"s" * 32,
    )


def rows(staged_file: object) -> list[list[str]]:
    f = staged_file  # type: ignore[assignment]
    f.seek(0)  # type: ignore[attr-defined]
    return [line.split("\t") for line in f.read().decode().splitlines()]  # type: ignore[attr-defined]


def test_jsonl_lines_become_copy_rows_in_order() -> None:
    s = stager()
    s.feed(b'{"input": "a\\tb", "custom_id": "c\\\\1"}\n\n{"input": "second"}')
    staged = s.finish()
    assert staged.count == 2 and len(staged.body_hash) == 64
    r = rows(staged.file)
    assert [x[1] for x in r] == ["0", "1"]
    assert r[0][2] == "c\\\\1" and r[1][2] == "\\N"
    assert r[0][3] == '"a\\\\tb"'  # the JSON text, its backslash escaped for COPY


@given(st.text(max_size=40))
def test_copy_unescape_undoes_copy_text(value: str) -> None:
    assert copy_unescape(copy_text(value).encode()) == value.encode()


TEXTS = st.text(
    st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=30,
).filter(str.strip)


@given(
    st.lists(
        st.one_of(TEXTS, st.sampled_from(["a\\b", "x\t\n\ry", '"\\t"'])), min_size=1, max_size=60
    ),
    st.integers(min_value=40, max_value=2000),
)
def test_a_staged_job_reads_back_as_its_items_in_order(inputs: list[str], page: int) -> None:
    """What a new job's publish sends (Staged.pages) is each item's JSON and request id,
    in input order, whatever the page size and whatever COPY had to escape."""
    s = stager()
    s.feed(
        b"".join(
            orjson.dumps({"input": x, "custom_id": f"c\t{i}"}) + b"\n" for i, x in enumerate(inputs)
        )
    )
    staged = s.finish()
    items = [item for p in staged.pages(page) for item in p]
    rid = job_item_request_ids("00000000-0000-0000-0000-000000000001")
    assert [i for i, _, _, _ in items] == list(range(len(inputs)))
    assert [orjson.loads(v) for _, v, _, _ in items] == inputs
    assert [r for _, _, r, _ in items] == [rid(i) for i in range(len(inputs))]
    assert {a for _, _, _, a in items} == {0}


@pytest.mark.parametrize(
    "body,status,field",
    [
        (b'{"input": "ok"}\n{"input": "a\\u0000b"}\n', 400, "line 2.input"),
        (b'{"input": "ok", "custom_id": "x\\u0000"}\n', 400, "line 1.custom_id"),
        (b'{"input": "ok"}\n{"input": "fine", "extra": 1}\n', 422, "line 2.extra"),
        (b'{"input": "ok"}\n{oops\n', 400, "line 2"),
        (b'{"input": 1e400}\n', 400, "line 1"),
        (b'{"input": "\\ud800"}\n', 400, "line 1"),
        (b'{"custom_id": "x"}\n', 422, "line 1.input"),
        (b'{"input": ""}\n', 400, "line 1.input"),
        (b'{"input": "ok", "custom_id": "' + b"x" * 256 + b'"}\n', 400, "line 1.custom_id"),
        (b'{"input": "ok", "custom_id": 7}\n', 422, "line 1.custom_id"),
        (b"[1, 2]\n", 400, "line 1"),
        (b"\n\n\n", 400, "items"),
    ],
)
def test_bad_lines_are_refused_naming_line_and_field(body: bytes, status: int, field: str) -> None:
    s = stager()
    with pytest.raises((InvalidInput, SchemaViolation)) as e:
        s.feed(body)
        s.finish()
    assert e.value.status == status and e.value.field == field, e.value.message


def test_item_count_is_capped() -> None:
    s = stager(max_items=3)
    with pytest.raises(PayloadTooLarge):
        s.feed(b'{"input": "x"}\n' * 4)


def _stage(body: bytes, *, trace: bool = False) -> tuple[float, int]:
    """Seconds to stage ``body`` in 64 KiB chunks, and the peak traced memory."""
    s = stager(max_items=10**7)
    if trace:
        tracemalloc.start()
    t0 = time.perf_counter()
    for i in range(0, len(body), 65536):
        s.feed(body[i : i + 65536])
    staged = s.finish()
    took = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] if trace else 0
    tracemalloc.stop()
    staged.close()
    return took, peak


ITEM = orjson.dumps({"input": "y" * 30}) + b"\n"  # 45-byte lines


def test_staging_time_is_linear_in_the_items() -> None:
    t_small = min(_stage(ITEM * 40_000)[0] for _ in range(3))
    t_big = min(_stage(ITEM * 200_000)[0] for _ in range(2))
    assert t_big / t_small < 12, (t_small, t_big)


def test_staged_items_live_in_the_file_not_in_memory() -> None:
    body = ITEM * 100_000  # 4.5 MB
    _, peak = _stage(body, trace=True)
    # One chunk, one write buffer (256 KiB of rows), one line: not the body.
    assert peak < 2 << 20, peak


async def _trickle(chunks: list[bytes], gap_s: float) -> AsyncIterator[bytes]:
    for c in chunks:
        await asyncio.sleep(gap_s)
        yield c


def _read(chunks: list[bytes], gap_s: float, **kw: Any) -> list[bytes]:
    async def run() -> list[bytes]:
        return [c async for c in body_chunks(_trickle(chunks, gap_s), what="a body", **kw)]

    return asyncio.run(run())


def test_a_body_that_stops_arriving_is_408() -> None:
    with pytest.raises(RequestTimeout):
        _read([b"a", b"b"], 0.3, idle_timeout_s=0.1, max_bytes=100)
    assert _read([b"a", b"b"], 0.01, idle_timeout_s=0.5, max_bytes=100) == [b"a", b"b"]


def test_a_trickle_under_the_minimum_rate_is_408() -> None:
    t = iter(range(100))
    with pytest.raises(RequestTimeout, match="slower than"):
        # a fake clock: 1 s per chunk of 1 byte, against 10 bytes/s after 2 s
        _read(
            [b"x"] * 10,
            0,
            idle_timeout_s=2,
            max_bytes=100,
            min_rate_bps=10,
            clock=lambda: float(next(t)),
        )


def test_a_body_past_its_cap_is_413_as_it_arrives() -> None:
    with pytest.raises(PayloadTooLarge):
        _read([b"x" * 60, b"x" * 60, b"never read"], 0, idle_timeout_s=1, max_bytes=100)


@pytest.mark.parametrize(
    "obj",
    [
        {"input": "x"},
        {"custom_id": None, "input": "x"},
        {"custom_id": "a\tb", "input": "x\\y"},
        {"input": "x", "custom_id": "c"},
        {"custom_id": 5, "input": "x"},
        {"input": "x", "extra": 1},
        {"custom_id": "a"},
        {"custom_id": "a", "extra": 1},
        {"input": ["a"]},
        {"input": ""},
        {"input": "x", "custom_id": "c", "extra": None},
    ],
)
def test_the_plain_item_fast_path_stages_and_refuses_as_the_schema_does(obj: Any) -> None:
    from ingest.jobs.schemas import JobItem, validate

    def staged(add: Any) -> Any:
        s = stager()
        try:
            add(s)
            return rows(s.finish().file)
        except (InvalidInput, SchemaViolation) as exc:
            return (type(exc), exc.message, exc.field)
        finally:
            s.close()

    fast = staged(lambda s: s.add_object(obj, "line 1"))
    schema = staged(lambda s: s.add(validate(obj, JobItem, "line 1"), "line 1"))
    assert fast == schema
