"""Re-embedding a corpus (decision 68), the pure parts: naming a corpus, coverage, the
replay gate, the source check and the retire gate."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from core.errors import Conflict, InvalidInput
from core.models.reembed import (
    CORPUS_JOB,
    CORPUS_LOG,
    Migration,
    check_gate,
    check_retire,
    check_source,
    corpus_of,
    coverage,
    version_coverage,
)

NOW = datetime(2026, 11, 28, 4, 0, tzinfo=UTC)
JOB = "8d3c1c9e-2f0b-4c8e-9a53-0d1f2f3e4a5b"


def mig(
    succeeded: int,
    total: int = 10,
    *,
    cancelled: bool = False,
    from_version: str = "1",
    to_version: str = "2",
    name: str = "emb",
    job_id: str = JOB,
) -> Migration:
    corpus = {"kind": "job", "tenant": "acme", "job_id": "x"}
    return Migration(
        job_id, name, from_version, to_version, "acme", corpus, total, succeeded, cancelled
    )


def test_a_corpus_is_a_job_or_a_window_of_one_tenant() -> None:
    c = corpus_of("acme", job_id=JOB, now=NOW)
    assert c.kind == CORPUS_JOB
    assert c.described() == {"kind": "job", "tenant": "acme", "job_id": JOB}
    w = corpus_of("acme", since=NOW - timedelta(days=1), now=NOW)
    assert w.kind == CORPUS_LOG and w.until == NOW  # until defaults to now
    assert w.described()["since"] == "2026-11-27T04:00:00+00:00"


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({}, "corpus"),  # neither
        ({"job_id": JOB, "since": NOW - timedelta(hours=1)}, "corpus"),  # both
        ({"job_id": JOB, "until": NOW}, "corpus.until"),
        ({"since": NOW.replace(tzinfo=None) - timedelta(hours=1)}, "corpus.since"),
        ({"since": NOW, "until": NOW - timedelta(seconds=1)}, "corpus.until"),
    ],
)
def test_a_corpus_named_wrongly_is_a_400_naming_the_field(kw: dict, field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        corpus_of("acme", now=NOW, **kw)
    assert err.value.field == field


def test_a_corpus_names_its_tenant() -> None:
    with pytest.raises(InvalidInput) as err:
        corpus_of("", job_id=JOB, now=NOW)
    assert err.value.field == "corpus.tenant"


def test_coverage_is_the_share_embedded_by_the_new_version() -> None:
    assert coverage(0, 4) == 0.0
    assert coverage(3, 4) == 0.75
    assert coverage(4, 4) == 1.0
    assert coverage(5, 4) == 1.0  # never past whole
    assert coverage(0, 0) == 1.0  # nothing to move
    m = mig(7)
    assert m.coverage == 0.7 and not m.complete and m.pending
    assert mig(10).complete and not mig(10).pending
    assert not mig(3, cancelled=True).pending  # abandoned
    view = mig(7).view()
    assert view["coverage"] == 0.7 and view["state"] == "running" and view["covered"] == 7
    assert mig(10).view()["state"] == "complete"
    assert mig(1, cancelled=True).view()["state"] == "cancelled"


def test_coverage_per_version_adds_its_corpora_and_leaves_out_cancelled_ones() -> None:
    ms = [
        mig(10, 10),
        mig(5, 30),
        mig(0, 100, cancelled=True),
        mig(1, 4, to_version="3"),
        mig(2, 2, name="other"),
    ]
    assert version_coverage(ms) == {
        ("emb", "2"): 15 / 40,
        ("emb", "3"): 0.25,
        ("other", "2"): 1.0,
    }
    assert version_coverage([]) == {}


def test_the_gate_is_a_passing_replay() -> None:
    check_gate("emb", "2", replay_passed=True)
    with pytest.raises(Conflict) as err:
        check_gate("emb", "2", replay_passed=False)
    assert "no passing replay" in err.value.message
    assert "gristmill models replay --candidate emb@2" in err.value.message


def test_a_corpus_job_is_of_the_model_and_not_of_the_new_version() -> None:
    check_source("emb", "2", "emb", "1", "job x")
    with pytest.raises(InvalidInput, match="ran other, not emb"):
        check_source("emb", "2", "other", "1", "job x")
    with pytest.raises(InvalidInput, match="already ran emb@2"):
        check_source("emb", "2", "emb", "2", "job x")


def test_a_version_a_corpus_is_moving_off_or_onto_is_not_retired_until_covered() -> None:
    check_retire("emb", "1", [])
    with pytest.raises(Conflict) as err:
        check_retire("emb", "1", [mig(10), mig(3)])
    assert JOB in err.value.message and "30.0% covered" in err.value.message
    check_retire("emb", "1", [mig(10), mig(3, cancelled=True)])  # complete or abandoned
    with pytest.raises(Conflict, match="cancel that job first"):
        check_retire("emb", "2", [mig(3)])  # nor the one it moves to
    check_retire("emb", "2", [mig(10), mig(3, cancelled=True)])
    check_retire("emb", "1", [mig(3, name="other")])
