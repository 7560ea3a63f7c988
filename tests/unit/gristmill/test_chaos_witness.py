"""The chaos run's second witness (gristmill/chaos/witness.py, decision 54): when the
ledger's account contradicts the clients', and when it only could not finish."""

from __future__ import annotations

from gristmill.chaos.ledger import JobOutcome, Outcome
from gristmill.chaos.witness import Witness, client_accepted, tally
from results.ledger import Export


def export(accepted: int, terminal: int, missing: int = 0, pending: int = 0) -> Export:
    ids = [f"id-{i}" for i in range(missing)]
    return Export(accepted, terminal, missing, pending, 0, {}, ids)


def test_clients_were_told_200_504_and_the_items_of_202_jobs() -> None:
    outs = [Outcome(i, 0, "paid", "x", "", 0.0, status=s) for i, s in enumerate([200, 504, 503, 0])]
    jobs = [
        JobOutcome(0, 0, "paid", "", ["a", "b", "c"], 0.0, status=202),
        JobOutcome(1, 0, "paid", "", ["d"], 0.0, status=503),
    ]
    assert client_accepted(outs, jobs) == 2 + 3


def test_all_accounted_for_holds() -> None:
    w = tally([export(10, 10), export(5, 5)], True, 14)
    assert (w.accepted, w.terminal) == (15, 15) and not w.failed
    assert "15 accepted in Kafka" in w.line() and w.line().endswith("ok")


def test_anything_missing_fails_even_unfinished() -> None:
    w = tally([export(10, 9, missing=1)], False, 10)
    assert w.failed and "id-0" in w.line() and "FAIL" in w.line()


def test_fewer_in_kafka_than_clients_were_told_fails_once_read_through() -> None:
    assert tally([export(9, 9)], True, 10).failed
    assert not tally([export(9, 9)], False, 10).failed  # not read through: incomplete
    assert "incomplete" in tally([export(9, 9)], False, 10).line()


def test_pending_after_reading_through_fails() -> None:
    assert tally([export(10, 9, pending=1)], True, 10).failed


def test_a_witness_that_could_not_read_fails_nothing() -> None:
    w = Witness(client_accepted=3, error="KafkaException: down")
    assert not w.failed and "not read" in w.line()
