"""What the step loop's events become (outbox.py), and a Kafka message becoming the
policy's request, resumed from what was streamed (requests.py). Pure."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from core.messages import RequestMessage
from core.models.token_ids import tokenized_input
from ingest.openai.completion_wire import ending as _ending
from scheduler.core.generation.events import Finished, Preempted, Token
from scheduler.core.generation.outbox import Outbox
from scheduler.core.generation.requests import Progress, Refused, prepare, sampling_seed
from scheduler.core.generation.sequence import FinishReason
from scheduler.runtime.generation.flusher import answer
from tests.unit.scheduler.generation.helpers import batcher, drive, req


def finished(rid: str, text: str, tail: str = "", n: int = 0) -> Finished:
    return Finished(rid, FinishReason.LENGTH, text, tail, tuple(range(n)), 3, 0.0, 0.1, 0.2, 0)


def test_tokens_become_one_progress_row_per_flush_then_the_ending() -> None:
    o = Outbox()
    o.open("r", "t")
    o.add([Token("r", 0, 5, "a", 0.0), Token("r", 1, 6, "bc", 0.0)])
    f = o.take()
    assert [(p.first_index, p.token_ids, p.texts) for p in f.progress] == [(0, (5, 6), ("a", "bc"))]
    assert not f.endings
    o.add([Token("r", 2, 7, "d", 0.0), finished("r", "abcde", "e", 3)])
    f = o.take()
    assert not f.progress  # the ending's row holds the last tokens
    (e,) = f.endings
    assert e.offsets == (1, 3, 4) and e.completion_tokens == 3
    assert "r" not in o


def test_a_resumed_stream_counts_the_texts_streamed_before() -> None:
    o = Outbox()
    o.open("r", "t", prior_texts=("ab", "c"))
    o.add([Token("r", 2, 9, "d", 0.0), finished("r", "abcd", "", 3)])
    (e,) = o.take().endings
    assert e.offsets == (2, 3, 4)


def test_tokens_out_of_order_are_a_bug_not_a_gap() -> None:
    o = Outbox()
    o.open("r", "t")
    with pytest.raises(ValueError):
        o.add([Token("r", 1, 5, "a", 0.0)])


def test_dropped_requests_and_preemptions() -> None:
    o = Outbox()
    o.open("r", "t")
    o.open("x", "t")
    o.drop("r")  # its partition moved: the new owner streams it
    o.add([Token("r", 0, 5, "a", 0.0), Preempted("x", 4, 0.0)])
    assert not o.take() and o.preemptions == 1


def msg(**kw: object) -> RequestMessage:
    base: dict[str, object] = {
        "request_id": "r",
        "tenant_id": "t",
        "priority": "paid",
        "model": "gristmill-lm",
        "version": "1",
        "input": "hello world",
        "params": {"max_tokens": 5, "temperature": 0.0, "stop": []},
        "deadline": 2e9,
        "received_at": 1e9,
    }
    base.update(kw)
    return RequestMessage(**base)  # type: ignore[arg-type]


def encode(text: str) -> list[int]:
    return [ord(c) % 50 + 1 for c in text]


def test_text_and_token_ids_both_make_the_prompt() -> None:
    a = prepare(msg(), rank=1, encode=encode, context_length=64)
    b = prepare(
        msg(input=tokenized_input("hello world", encode("hello world"))),
        rank=1,
        encode=lambda _: [],
        context_length=64,
    )
    assert not isinstance(a, Refused) and not isinstance(b, Refused)
    assert a.req.prompt == b.req.prompt == tuple(encode("hello world"))
    assert a.prompt_tokens == 11


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"input": 3}, "text"),
        ({"input": ""}, "no tokens"),
        ({"params": {"max_tokens": 0}}, "max_tokens"),
        ({"params": {"max_tokens": 4, "temperature": -1}}, "temperature"),
        ({"params": {"max_tokens": 4, "temperature": 0.7}}, "seed"),
        ({"params": {"max_tokens": 4, "stop": "x"}}, "stop"),
        ({"input": "x" * 64}, "context"),
    ],
)
def test_unusable_messages_are_refused_with_the_reason(change: dict[str, object], why: str) -> None:
    got = prepare(msg(**change), rank=0, encode=encode, context_length=64)
    assert isinstance(got, Refused) and why in got.reason


def test_the_context_caps_max_tokens_and_a_resume_leaves_a_token_to_generate() -> None:
    m = msg(params={"max_tokens": 500, "temperature": 0.0})
    got = prepare(m, rank=0, encode=encode, context_length=20)
    assert not isinstance(got, Refused) and got.req.max_tokens == 9
    done = Progress((1, 2, 3, 4, 5, 6, 7, 8, 9), tuple("abcdefghi"))
    got = prepare(m, rank=0, encode=encode, context_length=20, progress=done)
    assert not isinstance(got, Refused)
    assert got.req.resume_output == (1, 2, 3, 4, 5, 6, 7, 8)
    assert got.prior_texts == tuple("abcdefgh") and got.req.resume_emitted == 8


def test_job_items_draw_their_own_seed_and_repeat_it() -> None:
    seeds = {sampling_seed(42, i) for i in range(1000)}
    assert len(seeds) == 1000
    assert sampling_seed(42, 7) == sampling_seed(42, 7) and sampling_seed(42, None) == 42


def test_a_resumed_request_streams_exactly_what_an_uninterrupted_one_does() -> None:
    """Generate, stop after some tokens (a scheduler dies), resume from what was
    streamed on a fresh policy: the tokens and text after that point are the same."""
    r = req(6, 12, seq_id="a")
    whole = drive(batcher(eos=None), [(0, r)])
    tokens = whole.tokens()["a"]
    cut = 5
    texts = tuple(t.text for t in tokens[:cut])
    resumed = dataclasses.replace(
        r,
        resume_output=tuple(t.token_id for t in tokens[:cut]),
        resume_emitted=sum(map(len, texts)),
    )
    again = drive(batcher(eos=None), [(0, resumed)])
    later = again.tokens()["a"]
    assert [t.index for t in later] == list(range(cut, len(tokens)))
    assert texts + tuple(t.text for t in later) == tuple(t.text for t in tokens)
    assert again.finished()["a"].text == whole.finished()["a"].text


def test_a_stream_that_resumes_after_the_end_gets_the_tokens_after_the_one_it_saw() -> None:
    o = Outbox()
    o.open("r", "t")
    o.add([Token("r", 0, 1, "He", 0.0), Token("r", 1, 2, "llo", 0.0), Token("r", 2, 3, ",", 0.0)])
    o.add([finished("r", "Hello, world", " world", 3)])
    (e,) = o.take().endings
    row = {"status": "succeeded", "output": answer(e), "error": None}

    async def collect(after: int) -> list[bytes]:
        return [x async for x in _ending(row, "r", 0, "m", after, usage=True)]

    parts = asyncio.run(collect(1))
    assert b"id: 1\n" in parts[0] and b'"llo"' in parts[0]
    assert b'"text":","' in parts[1]
    assert b'" world"' in parts[2] and b'"finish_reason":"length"' in parts[2]
    assert b'"total_tokens":6' in parts[3] and parts[-1] == b"data: [DONE]\n\n"


def test_a_generations_fairness_id_is_its_sequences_flow() -> None:
    got = prepare(msg(fairness_id="user-3"), rank=1, encode=encode, context_length=64)
    plain = prepare(msg(), rank=1, encode=encode, context_length=64)
    assert not isinstance(got, Refused) and not isinstance(plain, Refused)
    assert got.req.flow == "user-3" and plain.req.flow is None
