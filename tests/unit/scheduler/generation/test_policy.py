"""The continuous-batching policy: joins, leaves, budgets, preemption, tiers, deadlines."""

from __future__ import annotations

import pytest

from core.generation import StepOutput
from scheduler.core.generation.events import Finished, Preempted, Token
from scheduler.core.generation.policy import InvalidRequest
from scheduler.core.generation.sequence import FinishReason, State
from tests.unit.scheduler.generation.fake_model import EOS, FakeRunner, decode, encode, reference
from tests.unit.scheduler.generation.helpers import batcher, drive, req


def test_one_sequence_generates_its_reference_text_and_frees_its_blocks() -> None:
    b = batcher()
    r = req(5, 10)
    run = drive(b, [(0, r)])
    done = run.finished()[r.seq_id]
    assert list(done.token_ids) == reference(r.prompt, 10)
    assert done.reason is FinishReason.LENGTH
    assert done.text == decode(done.token_ids)
    toks = run.tokens()[r.seq_id]
    assert [t.index for t in toks] == list(range(10))
    assert "".join(t.text for t in toks) + done.tail == done.text
    assert b.pool.used == 0 and not b.running and not b.has_work()


def test_a_prompt_is_prefilled_then_one_token_per_step() -> None:
    b = batcher(max_step_tokens=32)
    r = req(6, 3)
    run = drive(b, [(0, r)])
    sizes = [len(c.tokens) for p in run.plans for c in p.chunks]
    assert sizes == [6, 1, 1]
    assert run.plans[0].chunks[0].sample is not None  # the prefill samples the first token
    assert [p.chunks[0].sample.index for p in run.plans if p.chunks] == [0, 1, 2]  # type: ignore[union-attr]


def test_long_prompt_is_chunked_to_the_token_budget() -> None:
    b = batcher(max_step_tokens=8, max_running=4, max_model_len=64)
    r = req(20, 2)
    run = drive(b, [(0, r)])
    chunks = [c for p in run.plans for c in p.chunks]
    assert [len(c.tokens) for c in chunks] == [8, 8, 4, 1]
    assert [c.start for c in chunks] == [0, 8, 16, 20]
    assert [c.sample is not None for c in chunks] == [False, False, True, True]
    assert list(run.finished()[r.seq_id].token_ids) == reference(r.prompt, 2)


def test_sequences_join_between_steps_and_the_running_ones_keep_decoding() -> None:
    b = batcher(max_step_tokens=32)
    a, late = req(4, 12), req(4, 3)
    run = drive(b, [(0, a), (5, late)])
    assert run.scheduled(a.seq_id) == list(range(1, 13))  # never paused
    assert run.scheduled(late.seq_id) == [6, 7, 8]  # joined at the step after it arrived
    step6 = run.plans[5]
    assert {c.seq_id: len(c.tokens) for c in step6.chunks} == {a.seq_id: 1, late.seq_id: 4}
    for r in (a, late):
        assert list(run.finished()[r.seq_id].token_ids) == reference(r.prompt, r.max_tokens)


def test_a_finished_sequence_leaves_and_a_waiting_one_takes_its_place_next_step() -> None:
    b = batcher(max_running=2)
    short, long_, queued = req(4, 2), req(4, 10), req(4, 2)
    run = drive(b, [(0, short), (0, long_), (0, queued)])
    assert run.scheduled(short.seq_id) == [1, 2]
    assert run.scheduled(queued.seq_id)[0] == 3  # admitted right after `short` left
    assert max(len(p.chunks) for p in run.plans) == 2


def test_token_budget_holds_with_many_arrivals() -> None:
    b = batcher(max_step_tokens=10, max_running=6, num_blocks=200)
    arrivals = [(i % 7, req(3 + i % 9, 1 + i % 5)) for i in range(40)]
    run = drive(b, arrivals)
    assert all(p.num_tokens <= 10 for p in run.plans)
    assert any(p.num_tokens == 10 for p in run.plans)  # the budget is also used
    assert len(run.finished()) == 40


def test_eos_ends_a_sequence_without_entering_its_text() -> None:
    b = batcher()
    r = req(4, 200, ignore_eos=False)
    run = drive(b, [(0, r)], eos_every=5)
    done = run.finished()[r.seq_id]
    assert done.reason is FinishReason.STOP
    assert EOS not in done.token_ids
    assert list(done.token_ids) == reference(r.prompt, 200, eos_every=5, max_len=64)
    assert run.tokens()[r.seq_id][-1].token_id == EOS  # the stream sees it end


def test_ignore_eos_runs_to_max_tokens() -> None:
    b = batcher()
    r = req(4, 40, ignore_eos=True)
    run = drive(b, [(0, r)], eos_every=5)
    assert len(run.finished()[r.seq_id].token_ids) == 40


def test_stop_token_ids_stop() -> None:
    b = batcher()
    r0 = req(4, 30)
    ref = reference(r0.prompt, 30)
    r = req(4, 30, seq_id="st", stop_token_ids=(ref[6],))
    r = type(r)(**{**r.__dict__, "prompt": r0.prompt})
    done = drive(b, [(0, r)]).finished()["st"]
    assert list(done.token_ids) == ref[: ref.index(ref[6])]
    assert done.reason is FinishReason.STOP


def test_stop_string_cuts_the_text_and_is_never_streamed() -> None:
    b = batcher()
    probe = req(4, 30)
    full = decode(reference(probe.prompt, 30))
    stop = full[10:13]
    r = type(probe)(**{**probe.__dict__, "seq_id": "ss", "stop": (stop,)})
    run = drive(b, [(0, r)])
    done = run.finished()["ss"]
    assert done.reason is FinishReason.STOP
    assert done.text == full[: full.index(stop)]
    streamed = "".join(t.text for t in run.tokens()["ss"]) + done.tail
    assert streamed == done.text and stop not in streamed


def test_max_model_len_ends_with_length() -> None:
    b = batcher(max_model_len=16)
    r = req(10, 100)
    done = drive(b, [(0, r)]).finished()[r.seq_id]
    assert len(done.token_ids) == 6 and done.reason is FinishReason.LENGTH


def test_running_cap() -> None:
    b = batcher(max_running=3, max_step_tokens=64)
    run = drive(b, [(0, req(2, 6)) for _ in range(10)])
    assert max(len(p.chunks) for p in run.plans) == 3
    assert len(run.finished()) == 10


def test_higher_rank_is_admitted_first_whatever_the_arrival_order() -> None:
    b = batcher(max_running=1)
    free, paid, ent = req(2, 2, rank=2), req(2, 2, rank=1), req(2, 2, rank=0)
    for r in (free, paid, ent):
        b.add(r)
    run = drive(b)
    firsts = {r.seq_id: run.scheduled(r.seq_id)[0] for r in (free, paid, ent)}
    assert firsts[ent.seq_id] < firsts[paid.seq_id] < firsts[free.seq_id]


def test_out_of_blocks_preempts_the_lowest_rank_and_it_resumes_with_the_same_text() -> None:
    # 6 blocks of 4 tokens: two sequences growing to 4 + 12 tokens cannot both stay.
    b = batcher(num_blocks=6, block_size=4, max_model_len=24)
    low, high = req(4, 12, rank=2), req(4, 12, rank=0)
    run = drive(b, [(0, low), (0, high)])
    assert run.preempted() and set(run.preempted()) == {low.seq_id}
    done = run.finished()
    for r in (low, high):
        assert list(done[r.seq_id].token_ids) == reference(r.prompt, 12)
    assert done[low.seq_id].preemptions >= 1 and done[high.seq_id].preemptions == 0
    toks = run.tokens()[low.seq_id]
    assert [t.index for t in toks] == list(range(12))  # no token repeated or taken back
    # After the preemption `low` recomputes prompt + output in one chunk.
    resumed = [c for p in run.plans for c in p.chunks if c.seq_id == low.seq_id and c.start == 0]
    assert len(resumed) == 2 and len(resumed[1].tokens) > 4


def test_same_rank_victim_is_the_latest_arrival() -> None:
    b = batcher(num_blocks=6, block_size=4, max_model_len=24)
    first, second = req(4, 12, rank=1), req(4, 12, rank=1)
    run = drive(b, [(0, first), (0, second)])
    assert set(run.preempted()) == {second.seq_id}


def test_victim_inside_a_rank_is_the_tenant_holding_most_per_weight() -> None:
    b = batcher(num_blocks=12, block_size=4, max_model_len=32, max_running=3)
    big1, big2 = req(4, 20, tenant="big"), req(4, 20, tenant="big")
    small = req(4, 20, tenant="small")
    # `small` arrives last, so LIFO alone would pick it; `big` holds twice as much.
    run = drive(b, [(0, big1), (0, big2), (0, small)])
    assert run.preempted()[0] in {big1.seq_id, big2.seq_id}


def test_a_new_arrival_preempts_only_a_lower_rank() -> None:
    b = batcher(num_blocks=8, block_size=4, max_model_len=32, max_running=4)
    # `low` holds 6 of the 8 blocks by step 3; the arrival needs 3.
    low, same = req(20, 8, rank=2), req(12, 4, rank=2)
    run1 = drive(b, [(0, low), (3, same)])
    assert not run1.preempted()  # `same` waited for `low` instead of evicting it
    assert run1.scheduled(same.seq_id)[0] > run1.scheduled(low.seq_id)[-1]
    low2, high = req(20, 8, rank=2), req(12, 4, rank=0)
    run2 = drive(b, [(0, low2), (3, high)])
    assert run2.preempted() == [low2.seq_id]
    assert run2.scheduled(high.seq_id)[0] == 4  # admitted at the step it arrived before
    for r in (low2, high):
        assert list(run2.finished()[r.seq_id].token_ids) == reference(r.prompt, r.max_tokens)


def test_overcommit_one_reserves_the_worst_case_and_never_preempts() -> None:
    b = batcher(num_blocks=8, block_size=4, max_model_len=32, kv_overcommit=1.0)
    arrivals = [(0, req(4, 12)) for _ in range(5)]  # 4 blocks each at worst: 2 at a time
    run = drive(b, arrivals)
    assert not run.preempted()
    assert max(len(p.chunks) for p in run.plans) == 2
    assert b.reserved_blocks == 0


def test_waiting_sequence_expires_at_its_deadline_running_ones_do_not() -> None:
    b = batcher(max_running=1)
    running = req(2, 10, deadline=3.0)
    waiting = req(2, 2, deadline=3.0)
    run = drive(b, [(0, running), (0, waiting)])
    done = run.finished()
    assert done[waiting.seq_id].reason is FinishReason.EXPIRED
    assert done[waiting.seq_id].finished_at == 3.0
    assert done[running.seq_id].reason is FinishReason.LENGTH
    assert b.expired == 1


def test_a_preempted_sequence_with_output_does_not_expire() -> None:
    b = batcher(num_blocks=6, block_size=4, max_model_len=24)
    low, high = req(4, 12, rank=2, deadline=2.0), req(4, 12, rank=0)
    run = drive(b, [(0, low), (0, high)])
    assert run.preempted() == [low.seq_id] or low.seq_id in run.preempted()
    assert run.finished()[low.seq_id].reason is FinishReason.LENGTH


def test_cancel_frees_blocks_and_a_stale_chunk_is_ignored() -> None:
    b = batcher()
    r = req(4, 10)
    b.add(r)
    plan = b.schedule(0.0)
    assert b.pool.used > 0
    done = b.cancel(r.seq_id, 1.0)
    assert isinstance(done, Finished) and done.reason is FinishReason.CANCELLED
    assert b.pool.used == 0
    events = b.update(plan, StepOutput(plan.step, {r.seq_id: 3}), 1.0)
    assert events == [] and not b.has_work()
    assert b.cancel(r.seq_id, 2.0) is None


def test_cancel_a_waiting_and_a_preempted_sequence() -> None:
    b = batcher(max_running=1)
    a, w = req(2, 5), req(2, 5)
    b.add(a)
    b.add(w)
    b.schedule(0.0)
    assert b.sequence(w.seq_id).state is State.WAITING  # type: ignore[union-attr]
    assert b.cancel(w.seq_id, 0.0) is not None and b.num_waiting == 0
    b2 = batcher(num_blocks=6, block_size=4, max_model_len=24)
    low, high = req(4, 12, rank=2), req(4, 12, rank=0)
    run = drive(b2, [(0, low), (0, high)], max_steps=10_000)
    assert run.preempted()


def test_missing_sample_is_an_error() -> None:
    b = batcher()
    r = req(2, 3)
    b.add(r)
    plan = b.schedule(0.0)
    with pytest.raises(ValueError, match=r.seq_id):
        b.update(plan, StepOutput(plan.step, {}), 0.0)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"prompt_len": 64}, "prompt is 64 tokens"),
        ({"prompt_len": 0}, "no tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"rank": 9}, "rank 9"),
    ],
)
def test_invalid_requests_are_refused(kw: dict[str, int], match: str) -> None:
    b = batcher(max_model_len=64)
    args = {"prompt_len": 4, "max_tokens": 4, **kw}
    rank = args.pop("rank", 0)
    with pytest.raises(InvalidRequest, match=match):
        b.add(req(args["prompt_len"], args["max_tokens"], rank=rank))


def test_duplicate_id_is_refused() -> None:
    b = batcher()
    b.add(req(2, 2, seq_id="dup"))
    with pytest.raises(InvalidRequest, match="already"):
        b.add(req(2, 2, seq_id="dup"))


def test_sampling_is_reproducible_per_seed_whatever_the_batch() -> None:
    prompt = encode("hello")
    runs = []
    for companions in (0, 5):
        b = batcher(num_blocks=10, block_size=4, max_model_len=40)
        r = req(5, 20, seq_id="hot", temperature=0.9, seed=42)
        r = type(r)(**{**r.__dict__, "prompt": prompt})
        arrivals = [(0, r)] + [(i, req(3, 20)) for i in range(companions)]
        run = drive(b, arrivals)
        runs.append(list(run.finished()["hot"].token_ids))
    assert runs[0] == runs[1] == reference(prompt, 20, temperature=0.9, seed=42)
    other = reference(prompt, 20, temperature=0.9, seed=43)
    assert other != runs[0]


def test_events_of_a_step_come_in_order_tokens_before_finish() -> None:
    b = batcher()
    r = req(2, 1)
    run = drive(b, [(0, r)])
    first = run.by_step[0]
    assert isinstance(first[0], Token) and isinstance(first[1], Finished)
    assert not any(isinstance(e, Preempted) for e in run.events)


def test_a_resumed_request_goes_on_where_the_first_run_stopped() -> None:
    r = req(5, 20)
    ref = reference(r.prompt, 20)
    first = decode(ref[:7])
    again = type(r)(**{**r.__dict__, "seq_id": "again", "resume_output": tuple(ref[:7])})
    run = drive(batcher(), [(0, again)])
    done = run.finished()["again"]
    assert list(done.token_ids) == ref and done.text == decode(ref)
    toks = run.tokens()["again"]
    assert [t.index for t in toks] == list(range(7, 20))  # nothing sent twice
    assert first + "".join(t.text for t in toks) + done.tail == done.text
    assert run.plans[0].chunks[0].tokens == r.prompt + tuple(ref[:7])


def test_a_resumed_request_does_not_expire() -> None:
    r = req(4, 10, deadline=0.0, resume_output=(3, 4))
    done = drive(batcher(), [(0, r)]).finished()[r.seq_id]
    assert done.reason is FinishReason.LENGTH


def test_drop_cache_preempts_everything_running_and_all_resume() -> None:
    b = batcher()
    reqs = [req(4, 12, rank=i % 3) for i in range(5)]
    alone = drive(b, [(0, r) for r in reqs])
    assert not alone.preempted()
    b2 = batcher()
    for r in reqs:
        b2.add(type(r)(**{**r.__dict__, "seq_id": "x" + r.seq_id}))
    runner = FakeRunner(b2.cfg.num_blocks, b2.cfg.block_size)
    for step in range(3):
        plan = b2.schedule(float(step))
        b2.update(plan, runner.execute(plan), float(step))
    b2.drop_cache(3.0)
    assert b2.pool.used == 0 and not b2.running
    run = drive(b2)  # on a fresh, empty pool: reading a block of the old one fails
    assert len(run.preempted()) == 5
    for r in reqs:
        assert run.finished()["x" + r.seq_id].token_ids == alone.finished()[r.seq_id].token_ids


def test_a_quiet_tenant_is_not_stuck_behind_a_burst_of_its_own_rank() -> None:
    b = batcher(max_running=2)
    burst = [req(4, 6, tenant="burst") for _ in range(12)]
    quiet = [req(4, 6, tenant="quiet") for _ in range(2)]
    run = drive(b, [(0, r) for r in burst] + [(1, r) for r in quiet])
    first = {r.seq_id: run.scheduled(r.seq_id)[0] for r in burst + quiet}
    burst_before_quiet = [r for r in burst if first[r.seq_id] < first[quiet[1].seq_id]]
    assert len(burst_before_quiet) <= 4  # turns alternate once `quiet` is waiting
    assert max(first[r.seq_id] for r in quiet) < sorted(first[r.seq_id] for r in burst)[6]


def test_a_weighted_tenant_gets_its_share_of_admissions() -> None:
    b = batcher(max_running=1, max_step_tokens=64)
    gold = [req(4, 2, tenant="gold", weight=2.0) for _ in range(20)]
    std = [req(4, 2, tenant="std", weight=1.0) for _ in range(20)]
    run = drive(b, [(0, r) for r in gold + std])
    order = sorted(gold + std, key=lambda r: run.scheduled(r.seq_id)[0])[:15]
    assert sum(r.tenant == "gold" for r in order) == 10


def test_a_long_prefill_never_stalls_running_streams() -> None:
    b = batcher(max_step_tokens=16, max_running=8, max_model_len=64)
    streams = [req(2, 30, rank=2) for _ in range(5)]
    big = req(50, 2, rank=0)
    run = drive(b, [(0, r) for r in streams] + [(3, big)])
    for r in streams:  # a token every step from the first to the last
        steps = run.scheduled(r.seq_id)
        assert steps == list(range(steps[0], steps[0] + len(steps)))
    chunks = [len(c.tokens) for p in run.plans for c in p.chunks if c.seq_id == big.seq_id]
    assert chunks[:-2] and all(n <= 16 - 5 for n in chunks[:-1])


def test_each_answer_keeps_the_gaps_between_its_tokens() -> None:
    # Time is the step number: one token a step after the prefill, so every gap is 1 s;
    # a sequence chunked over three prefill steps still has n - 1 gaps of its own tokens.
    b = batcher(max_step_tokens=8, max_running=4, max_model_len=64)
    short, chunked = req(3, 6), req(20, 4)
    run = drive(b, [(0, short), (0, chunked)])
    assert run.finished()[short.seq_id].token_gaps == (1.0,) * 5
    assert run.finished()[chunked.seq_id].token_gaps == (1.0,) * 3


def test_a_preempted_sequence_counts_its_pause_as_one_long_gap() -> None:
    b = batcher(num_blocks=6, block_size=4, max_model_len=24)
    low, high = req(4, 12, rank=2), req(4, 12, rank=0)
    run = drive(b, [(0, low), (0, high)])
    assert run.preempted()
    gaps = run.finished()[low.seq_id].token_gaps
    assert len(gaps) == 11 and max(gaps) > 1.0  # waited while the higher rank ran
    assert run.finished()[high.seq_id].token_gaps == (1.0,) * 11
