"""Comparing a candidate's answers with recorded ones (gristmill/replay_report.py)."""

from __future__ import annotations

import math

import pytest

from gristmill.replay import greedy, parse_since, sampled
from gristmill.replay_report import (
    COSINE,
    EXACT,
    TEXT,
    Pair,
    Thresholds,
    compare,
    cosine,
    edit_distance,
    render,
    token_similarity,
)


def test_exact_agreement_per_tier_and_overall() -> None:
    pairs = [
        Pair("paid", True, {"d": 1}, 10.0, True, {"d": 1}, 12.0),
        Pair("paid", True, {"d": 2}, 10.0, True, {"d": 3}, 12.0),
        Pair("free", True, {"d": 4}, 20.0, True, {"d": 4}, 18.0),
    ]
    r = compare(pairs, Thresholds(min_agreement=0.5))
    assert r.mode == EXACT
    assert [g.name for g in r.tiers] == ["paid", "free"]
    assert r.tiers[0].agreement == 0.5 and r.tiers[1].agreement == 1.0
    assert r.overall.agreement == pytest.approx(2 / 3) and r.passed
    strict = compare(pairs, Thresholds(min_agreement=0.99))
    assert not strict.passed and "agreement" in strict.reasons[0]


def test_embeddings_agree_by_cosine() -> None:
    a = [1.0, 0.0, 0.0]
    near = [0.9999, 0.01, 0.0]
    far = [0.0, 1.0, 0.0]
    pairs = [
        Pair("paid", True, a, 1.0, True, near, 1.0),
        Pair("paid", True, a, 1.0, True, far, 1.0),
    ]
    r = compare(pairs, Thresholds(min_agreement=0.4, min_cosine=0.99))
    assert r.mode == COSINE
    assert r.overall.agreed == 1 and r.overall.row()["min_cosine"] == pytest.approx(0.0)
    assert cosine(a, near) > 0.9999


def test_error_rates_and_their_delta() -> None:
    pairs = [Pair("free", True, 1, None, False)] * 3 + [
        Pair("free", False, None, None, True, 1)
    ] * 1
    r = compare(pairs, Thresholds(max_error_delta=0.01))
    g = r.overall
    assert g.original_error_rate == 0.25 and g.candidate_error_rate == 0.75
    assert not r.passed and any("fails 75.00%" in x for x in r.reasons)


def test_unanswered_requests_fail_the_replay() -> None:
    r = compare([Pair("paid", True, 1, 5.0, None)])
    assert not r.passed and "no answer in time" in r.reasons[0]
    assert r.overall.answered == 0


def test_no_traffic_is_no_pass() -> None:
    r = compare([])
    assert not r.passed and "no recorded requests" in r.reasons[0]


def test_latency_percentiles_and_change() -> None:
    pairs = [Pair("paid", True, 1, float(i), True, 1, float(2 * i)) for i in range(1, 101)]
    row = compare(pairs).overall.row()
    assert row["original_p95_ms"] == pytest.approx(95, abs=1)
    assert row["p95_change"] == pytest.approx(1.0, abs=0.02)


def test_the_table_names_every_tier_and_the_verdict() -> None:
    pairs = [Pair(t, True, 1, 1.0, True, 1, 1.0) for t in ("free", "enterprise")]
    text = render(compare(pairs), "m", "m@2")
    assert "enterprise" in text and "free" in text and text.endswith("PASSED")
    assert not math.isnan(compare(pairs).overall.agreement)


def test_since_takes_a_number_and_a_unit() -> None:
    assert parse_since("1h").total_seconds() == 3600
    assert parse_since("90s").total_seconds() == 90
    assert parse_since("1.5m").total_seconds() == 90
    with pytest.raises(Exception, match="unit"):
        parse_since("1 hour")


def _gen(text: str) -> dict[str, object]:
    # A completion's request-log output: the text and what differs run to run.
    return {"text": text, "finish_reason": "length", "time_to_first_token_ms": 3.0}


def test_generated_text_agrees_by_exact_text_and_reports_token_similarity() -> None:
    pairs = [
        # Same text, other timings: agrees.
        Pair("paid", True, _gen("the wheel turns"), 5.0, True, _gen("the wheel turns"), 6.0),
        # One word of three differs: no exact match, similarity 2/3.
        Pair("paid", True, _gen("the wheel turns"), 5.0, True, _gen("the mill turns"), 6.0),
        # Nothing in common: similarity 0.
        Pair("free", True, _gen("a b"), 5.0, True, _gen("c d e f"), 6.0),
        # The candidate failed: not compared, counted as its error.
        Pair("free", True, _gen("x"), 5.0, False, None, 6.0),
    ]
    r = compare(pairs, Thresholds(min_agreement=0.3, max_error_delta=0.5))
    assert r.mode == TEXT
    assert r.overall.compared == 3 and r.overall.agreed == 1
    assert r.overall.similarities == pytest.approx([1.0, 2 / 3, 0.0])
    row = r.overall.row()
    assert row["mean_token_similarity"] == pytest.approx(5 / 9)
    assert row["min_token_similarity"] == 0.0
    assert r.tiers[0].row()["mean_token_similarity"] == pytest.approx(5 / 6)
    assert r.passed
    table = render(r, "gristmill-lm", "gristmill-lm@2")
    assert "text comparison" in table and "tok sim" in table and "0.5556" in table
    assert not compare(pairs, Thresholds(min_agreement=0.99)).passed


def test_text_similarity_counts_the_given_tokens() -> None:
    pairs = [Pair("paid", True, _gen("abcd"), 1.0, True, _gen("abed"), 1.0)]
    by_char = compare(pairs, tokenize=list)  # one substitution in four characters
    assert by_char.overall.similarities == [0.75]
    assert compare(pairs).overall.similarities == [0.0]  # one word against another


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [
        ("", "", 0),
        ("abc", "", 3),
        ("", "ab", 2),
        ("kitten", "sitting", 3),
        ("flaw", "lawn", 2),
        ("same", "same", 0),
    ],
)
def test_edit_distance(a: str, b: str, distance: int) -> None:
    assert edit_distance(a, b) == distance == edit_distance(b, a)
    sim = token_similarity(a, b)
    assert 0.0 <= sim <= 1.0
    assert sim == (1.0 if not (a or b) else 1 - distance / max(len(a), len(b)))


def test_greedy_replays_drop_the_seed_and_only_sampled_answers_run_again() -> None:
    assert greedy({"max_tokens": 8, "temperature": 0.8, "seed": 5, "stop": []}) == {
        "max_tokens": 8,
        "temperature": 0.0,
        "stop": [],
    }
    assert sampled({"temperature": 0.8}) and sampled({})  # OpenAI's default is 1
    assert not sampled({"temperature": 0}) and not sampled({"temperature": 0.0})
