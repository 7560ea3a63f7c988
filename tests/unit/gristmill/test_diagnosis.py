"""gristmill doctor's judgements: observed facts in, plain findings out."""

from __future__ import annotations

from gristmill.diagnosis import (
    KafkaFacts,
    Level,
    ModelRow,
    PostgresFacts,
    SecurityView,
    TopicFacts,
    exit_code,
    judge_durability,
    judge_kafka,
    judge_postgres,
    judge_schema,
    judge_settings,
    judge_workers,
    render,
)

TOPICS = {"enterprise": "gm.requests.enterprise", "deadletter": "gm.deadletter"}
GOOD = TopicFacts(partitions=12, replicas=3, min_isr_now=3, min_insync_replicas=2)


def levels(findings: list) -> list[Level]:  # type: ignore[type-arg]
    return [f.level for f in findings]


def kafka(facts: KafkaFacts, schedulers: int = 1) -> list:  # type: ignore[type-arg]
    return judge_kafka(
        facts,
        bootstrap="k:9093",
        protocol="SASL_SSL",
        username="gm",
        topics=TOPICS,
        live_schedulers=schedulers,
    )


def test_healthy_cluster_has_no_problem() -> None:
    out = kafka(KafkaFacts(brokers=3, topics=dict.fromkeys(TOPICS.values(), GOOD)))
    assert set(levels(out)) == {Level.OK}
    assert "enterprise 12, deadletter 12" in render(out)
    assert exit_code(out) == 0


def test_sasl_refusal_is_named_as_such() -> None:
    out = kafka(KafkaFacts(error="SASL authentication error: Authentication failed"))
    assert levels(out) == [Level.FAIL]
    assert "refused the SASL login of user 'gm'" in out[0].message
    assert exit_code(out) == 1


def test_tls_failure_and_unreachable_broker_are_told_apart() -> None:
    tls = kafka(KafkaFacts(error="SSL handshake failed: certificate verify failed"))
    down = kafka(KafkaFacts(error="Connect to ipv4#10.0.0.1:9093 failed: Connection refused"))
    assert "TLS handshake" in tls[0].message
    assert "no Kafka broker answers at k:9093" in down[0].message


def test_missing_topic_fails_and_says_migrate() -> None:
    out = kafka(KafkaFacts(brokers=3, topics={"gm.deadletter": GOOD}))
    assert any(f.level is Level.FAIL and "gristmill migrate" in f.message for f in out)


def test_settings_that_stop_writes_and_replicas_out_of_sync() -> None:
    all_must_ack = TopicFacts(12, replicas=3, min_isr_now=3, min_insync_replicas=3)
    impossible = TopicFacts(12, replicas=1, min_isr_now=1, min_insync_replicas=2)
    under = TopicFacts(12, replicas=3, min_isr_now=1, min_insync_replicas=2)

    def judged(t: TopicFacts) -> list:  # type: ignore[type-arg]
        return kafka(KafkaFacts(brokers=3, topics=dict.fromkeys(TOPICS.values(), t)))

    assert any("one broker down stops every write" in f.message for f in judged(all_must_ack))
    assert Level.FAIL in levels(judged(impossible))
    assert any(f.level is Level.FAIL and "fail now" in f.message for f in judged(under))
    assert Level.FAIL not in levels(judged(GOOD))


def test_durability_rules_are_the_start_up_check() -> None:
    one_copy = TopicFacts(12, replicas=1, min_isr_now=1, min_insync_replicas=1)
    unclean = TopicFacts(12, 3, 3, 2, unclean_election=True)
    pg = PostgresFacts(host="db:5432", user="a", synchronous_commit="off", fsync="on")
    out = judge_durability({"t1": one_copy, "t2": unclean}, pg, allowed=False)
    text = render(out)
    assert "t1 has replication factor 1" in text and "min.insync.replicas=1" in text
    assert "unclean.leader.election.enable=true" in text
    assert "synchronous_commit=off" in text and "refuse to start" in text
    assert set(levels(out)) == {Level.FAIL}
    waived = judge_durability({"t1": one_copy}, None, allowed=True)
    assert set(levels(waived)) == {Level.WARN}
    assert "GRISTMILL_ALLOW_WEAK_DURABILITY is set" in waived[0].message
    good_pg = PostgresFacts(host="db", user="a", synchronous_commit="on", fsync="on")
    assert levels(judge_durability({"t": GOOD}, good_pg, allowed=False)) == [Level.OK]


def test_more_schedulers_than_partitions_is_a_warning() -> None:
    small = TopicFacts(2, 3, 3, 2)
    out = kafka(KafkaFacts(brokers=3, topics=dict.fromkeys(TOPICS.values(), small)), 5)
    assert any("3 of them get none" in f.message for f in out)


def test_postgres_durability_and_tls() -> None:
    base = {"host": "db:5432", "user": "app", "synchronous_commit": "on"}
    assert set(levels(judge_postgres(PostgresFacts(ssl=True, sslmode="verify-full", **base)))) == {
        Level.OK
    }
    plain = judge_postgres(PostgresFacts(ssl=False, sslmode="prefer", **base))
    assert any("not encrypted" in f.message for f in plain)
    unverified = judge_postgres(PostgresFacts(ssl=True, sslmode="require", **base))
    assert any("sslmode require" in f.message for f in unverified)
    standby = judge_postgres(
        PostgresFacts(in_recovery=True, ssl=True, sslmode="verify-full", **base)
    )
    assert any("read-only standby" in f.message for f in standby)
    async_rep = judge_postgres(PostgresFacts(ssl=True, sslmode="verify-full", replicas=2, **base))
    assert any("asynchronously" in f.message for f in async_rep)


def test_loopback_postgres_without_tls_is_fine() -> None:
    out = judge_postgres(PostgresFacts(host="127.0.0.1:5432", user="a", synchronous_commit="on"))
    assert set(levels(out)) == {Level.OK}


def test_postgres_errors_in_plain_words() -> None:
    pw = judge_postgres(
        PostgresFacts(error='FATAL:  password authentication failed for user "app"', user="app")
    )
    hba = judge_postgres(
        PostgresFacts(error="FATAL:  pg_hba.conf rejects connection ..., no encryption")
    )
    assert "refused the password of user 'app'" in pw[0].message
    assert "only TLS connections" in hba[0].message


def test_schema_revision_against_head() -> None:
    known = ["0004", "0003", "0002", "0001"]
    assert levels(judge_schema(["0004"], ["0004"], known)) == [Level.OK]
    behind = judge_schema(["0003"], ["0004"], known)
    assert behind[0].level is Level.FAIL and "gristmill migrate" in behind[0].message
    ahead = judge_schema(["0005"], ["0004"], known)
    assert "newer release" in ahead[0].message
    assert "no Gristmill schema" in judge_schema(None, ["0004"], known)[0].message


def test_live_workers_per_model() -> None:
    models = [ModelRow("sim", "1", True), ModelRow("embed", "1", False)]
    out = judge_workers(models, [{"sim@1": 1000.0}, {"sim@1": 980.0}])
    text = render(out)
    assert "sim@1: live workers under 2 scheduler(s), 1,980 items/s" in text
    assert "embed@1 has no live worker" in text
    assert exit_code(out) == 0 and exit_code(out, strict=True) == 1
    assert levels(judge_workers(models, [])) == [Level.FAIL]
    assert Level.FAIL in levels(judge_workers(models, [{}]))


def test_settings_risks() -> None:
    view = SecurityView("kafka.prod:9092", "PLAINTEXT", "PLAIN", True, "*")
    text = render(judge_settings(view))
    assert "without TLS or a login" in text
    assert "any client can claim any address" in text
    local = SecurityView("127.0.0.1:9092", "PLAINTEXT", "PLAIN", True, "")
    assert levels(judge_settings(local)) == [Level.OK]
