"""Result announcements: answers ride in the NOTIFY payload, under PostgreSQL's cap."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import orjson
import pytest

from results import announce
from results.db import RESULTS_CHANNEL, is_reply_channel, reply_channel
from results.store import announcements
from results.vectors import from_floats, to_floats

T0 = datetime(2026, 11, 26, 12, 0, 0, 123456, tzinfo=UTC)


def row(i: int, **kw: Any) -> dict[str, Any]:
    return {
        "request_id": str(uuid.UUID(int=i)),
        "status": "succeeded",
        "error": None,
        "model": "sim",
        "model_version": "1",
        "batch_size": 3,
        "received_at": T0,
        "consumed_at": T0 + timedelta(milliseconds=5),
        "batched_at": T0 + timedelta(milliseconds=40),
        "compute_start_at": T0 + timedelta(milliseconds=41),
        "compute_end_at": T0 + timedelta(milliseconds=141),
        "job_id": None,
        **kw,
    }


def test_an_inline_answer_decodes_to_what_a_fetched_row_holds() -> None:
    r = row(1)
    at = T0 + timedelta(milliseconds=143)
    out = {"label": "positive", "scores": [0.25, 1e-07]}
    answer = announce.Answers(at).answer(r, orjson.dumps(out).decode(), None)
    [payload] = announce.payloads([answer], [])
    [got], ids = announce.parse(payload)
    assert ids == []
    assert got["output"] == out and got["persisted_at"] == at
    for k in (*announce.TIMES, *announce.PLAIN):
        assert got[k] == r[k], k


def test_missing_times_and_a_failed_answer_survive() -> None:
    r = row(2, status="failed", error="boom", batch_size=None, batched_at=None)
    [payload] = announce.payloads([announce.Answers(T0).answer(r, None, None)], [])
    [got], _ = announce.parse(payload)
    assert got["status"] == "failed" and got["error"] == "boom"
    assert got["batched_at"] is None and got["output"] is None and got["batch_size"] is None


def test_payloads_stay_under_the_cap_and_keep_every_answer_and_id_in_order() -> None:
    answers = [
        announce.Answers(T0).answer(row(i), orjson.dumps("x" * (i % 500)).decode(), None)
        for i in range(300)
    ]
    ids = [str(uuid.UUID(int=10_000 + i)) for i in range(500)]
    payloads = announce.payloads(answers, ids)
    assert len(payloads) > 1
    assert all(len(p.encode()) < 8000 for p in payloads)
    parsed = [announce.parse(p) for p in payloads]
    assert [r["request_id"] for rows, _ in parsed for r in rows] == [
        str(uuid.UUID(int=i)) for i in range(300)
    ]
    assert [i for _, got in parsed for i in got] == ids


def test_nothing_to_announce_is_no_payload() -> None:
    assert announce.payloads([], []) == []


def test_an_oversized_answer_is_refused_by_the_packer() -> None:
    with pytest.raises(ValueError):
        announce.payloads([b"x" * (announce.INLINE_MAX + 1)], [])


def test_the_store_inlines_new_sync_answers_and_names_the_rest() -> None:
    new, redelivered, big, job = row(1), row(2), row(3), row(4, job_id=str(uuid.uuid4()))
    outputs = ['"small"', '"again"', orjson.dumps("y" * 5000).decode(), '"job"']
    # The insert returns only rows written now: the redelivered one's row existed.
    written = [True, False, True, True]
    [(channel, payload)] = announcements(
        [new, redelivered, big, job], outputs, [None] * 4, written, T0
    )
    assert channel == RESULTS_CHANNEL  # rows that name no reply channel
    rows, ids = announce.parse(payload)
    assert [r["request_id"] for r in rows] == [new["request_id"]]
    assert rows[0]["output"] == "small" and rows[0]["output_vector"] is None
    assert ids == [redelivered["request_id"], big["request_id"]]  # no job item announced


def test_an_embedding_rides_inline_as_its_stored_bytes() -> None:
    """A 384-value vector (1,536 bytes, 2,048 in base64) fits an inline answer; the
    waiter gets back exactly the bytes the row holds."""
    values = [((-1) ** i) * i / 7 for i in range(384)]
    vector = from_floats(values)
    r = row(5)
    [(_, payload)] = announcements([r], [None], [vector], [True], T0)
    [got], ids = announce.parse(payload)
    assert ids == [] and got["output"] is None and got["output_vector"] == vector
    assert to_floats(got["output_vector"]) == [float(np.float32(v)) for v in values]
    assert len(payload.encode()) < announce.INLINE_MAX + 100


def test_answers_over_the_inline_limit_are_announced_by_id() -> None:
    """The scheduler's announce_inline_max_bytes: a vector answer (about 2,200 bytes)
    over it goes by id, a small one under it still inline; 0 sends every answer by id."""
    vec = from_floats([0.25] * 384)
    small, embedding = row(7), row(8)
    notes = announcements(
        [small, embedding], ['"label"', None], [None, vec], [True, True], T0, 1000
    )
    [(_, payload)] = notes
    rows, ids = announce.parse(payload)
    assert [r["request_id"] for r in rows] == [small["request_id"]]
    assert ids == [embedding["request_id"]]
    [(_, payload)] = announcements(
        [small, embedding], ['"label"', None], [None, vec], [True, True], T0, 0
    )
    assert announce.parse(payload) == ([], [small["request_id"], embedding["request_id"]])


def test_two_embeddings_share_a_payload_and_a_batch_stays_under_the_cap() -> None:
    rs = [row(100 + i) for i in range(256)]
    vec = from_floats([0.5] * 384)
    payloads = [p for _, p in announcements(rs, [None] * 256, [vec] * 256, [True] * 256, T0)]
    assert len(payloads) == 128
    assert all(len(p.encode()) < 8000 for p in payloads)


def test_answers_of_one_batch_share_their_common_part_but_keep_their_own() -> None:
    """Rows of a batch differ in id, received and consumed times and output; the rest is
    encoded once. Every answer still decodes to exactly its own row."""
    rows = [
        row(
            200 + i,
            received_at=T0 + timedelta(microseconds=i),
            consumed_at=T0 + timedelta(milliseconds=i % 2),
        )
        for i in range(5)
    ]
    rows[4] = {**rows[4], "status": "failed", "error": 'a "quoted" error', "batch_size": None}
    at = T0 + timedelta(seconds=1)
    outs = [orjson.dumps({"i": i}).decode() for i in range(5)]
    written = [True] * 5
    payloads = [p for _, p in announcements(rows, outs, [None] * 5, written, at)]
    got = [g for p in payloads for g in announce.parse(p)[0]]
    assert [g["request_id"] for g in got] == [r["request_id"] for r in rows]
    for g, r, i in zip(got, rows, range(5), strict=True):
        assert g["output"] == {"i": i} and g["persisted_at"] == at
        for k in (*announce.TIMES, *announce.PLAIN):
            assert g[k] == r[k], k


def test_a_request_id_in_another_spelling_still_counts_as_written() -> None:
    from results.store import is_written

    rid = uuid.UUID(int=7)
    rows = [{"request_id": str(rid).upper()}, {"request_id": str(uuid.UUID(int=8))}]
    assert is_written(rows, [str(rid)]) == [True, False]
    assert is_written(rows, []) == [False, False]


def test_a_listener_makes_rows_only_of_the_answers_it_waits_for() -> None:
    """Every API process hears every announcement: the others' answers are skipped before
    their times and vectors are decoded."""
    rs = [row(300 + i) for i in range(6)]
    vector = from_floats([0.5] * 384)
    payloads = [p for _, p in announcements(rs, [None] * 6, [vector] * 6, [True] * 6, T0)]
    wanted = {rs[1]["request_id"], rs[4]["request_id"]}
    got = [g for p in payloads for g in announce.parse(p, wanted)[0]]
    assert sorted(g["request_id"] for g in got) == sorted(wanted)
    assert all(g["output_vector"] == vector for g in got)


def test_each_answer_goes_to_the_channel_of_the_process_that_waits() -> None:
    """Rows naming a reply channel are announced there alone, answers and ids each in
    their process's payloads; rows naming none on the shared channel (decision 70)."""
    a, b = reply_channel("aa"), reply_channel("bb")
    rs = [row(400 + i) for i in range(5)]
    for r, ch in zip(rs, [a, b, a, None, b], strict=True):
        if ch is not None:
            r["reply_to"] = ch
    outs = ['"x"'] * 5
    written = [True, True, False, True, True]  # the third: redelivered, announced by id
    notes = announcements(rs, outs, [None] * 5, written, T0)
    heard: dict[str, tuple[list[str], list[str]]] = {}
    for channel, payload in notes:
        rows, ids = announce.parse(payload)
        got = heard.setdefault(channel, ([], []))
        got[0].extend(str(r["request_id"]) for r in rows)
        got[1].extend(ids)
    ids = [r["request_id"] for r in rs]
    assert heard == {
        a: ([ids[0]], [ids[2]]),
        b: ([ids[1], ids[4]], []),
        RESULTS_CHANNEL: ([ids[3]], []),
    }


@pytest.mark.parametrize(
    "name, ok",
    [
        (reply_channel("0123456789abcdef"), True),
        (RESULTS_CHANNEL, False),  # the shared one is not a reply channel
        (RESULTS_CHANNEL + "_", False),
        (RESULTS_CHANNEL + "_XYZ", False),
        (RESULTS_CHANNEL + "_" + "a" * 33, False),
        ("gristmill_models", False),  # a message may not have its answer sent elsewhere
        ("gristmill_results_ab; drop", False),
        (7, False),
        (None, False),
    ],
)
def test_only_a_channel_the_api_could_name_is_a_reply_channel(name: object, ok: bool) -> None:
    assert is_reply_channel(name) is ok
