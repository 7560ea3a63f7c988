"""Comparing a candidate's answers with recorded ones (gristmill/replay_report.py)."""

from __future__ import annotations

import math

import pytest

from gristmill.replay import parse_since
from gristmill.replay_report import COSINE, EXACT, Pair, Thresholds, compare, cosine, render


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
