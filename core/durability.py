"""Whether Kafka and PostgreSQL keep what Gristmill acknowledges, checked at start-up.

A 200 or 202 promises the request is durable (decision 0001), and a persisted result
lets its offset be committed: that holds only if Kafka keeps an acknowledged message
through the loss of a broker and PostgreSQL keeps a committed row through a crash.
Outside development the API and the scheduler call ``results.durability.
check_durability`` before serving and refuse to start while it names a problem,
unless ``allow_weak_durability`` is set (decision 0020). The rules are pure functions
over facts read from the services.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from core.config import KafkaSettings
from core.kafka import admin_config
from core.topics import all_request_topics, dead_letter_topic

# A message acknowledged with acks=all is on min.insync.replicas brokers; with 3
# replicas and 2 in sync, losing any one broker neither loses it nor stops producing.
MIN_REPLICATION = 3
MIN_INSYNC = 2
# synchronous_commit values under which a commit returns only once its WAL is flushed
# (with a synchronous standby: written or applied there too). `local` is refused: it
# skips a configured synchronous standby, so a failover may lose acknowledged results.
SYNC_COMMITS = ("on", "remote_write", "remote_apply")
ALLOW_HINT = "set GRISTMILL_ALLOW_WEAK_DURABILITY=true to run anyway (development and tests only)"


@dataclass(frozen=True, slots=True)
class TopicDurability:
    replication: int  # the fewest replicas of any of its partitions
    min_insync: int
    unclean_election: bool  # an out-of-sync replica may become leader (and lose data)


def checked_topics(settings: KafkaSettings) -> list[str]:
    """The request topics, and the dead-letter topic that keeps given-up requests."""
    return [*all_request_topics(settings), dead_letter_topic(settings)]


def kafka_problems(topics: Mapping[str, TopicDurability | None]) -> list[str]:
    """What keeps an acknowledged message from surviving a broker's loss (None: the
    topic does not exist)."""
    out = []
    for name, t in topics.items():
        if t is None:
            out.append(f"Kafka topic {name} does not exist")
            continue
        if t.replication < MIN_REPLICATION:
            out.append(
                f"Kafka topic {name} has replication factor {t.replication}, "
                f"needs >= {MIN_REPLICATION} (GRISTMILL_TOPIC_REPLICATION when topics are "
                "created; kafka-reassign-partitions for existing ones)"
            )
        if t.min_insync < MIN_INSYNC:
            out.append(
                f"Kafka topic {name} has min.insync.replicas={t.min_insync}, needs >= {MIN_INSYNC}"
            )
        if t.unclean_election:
            out.append(f"Kafka topic {name} has unclean.leader.election.enable=true")
    return out


def postgres_problems(pg: Mapping[str, str]) -> list[str]:
    """What keeps a committed result from surviving a PostgreSQL crash; ``pg`` maps
    setting names to their values (``SHOW``)."""
    out = []
    sync = pg.get("synchronous_commit", "")
    if sync not in SYNC_COMMITS:
        out.append(f"PostgreSQL synchronous_commit={sync}, needs one of {', '.join(SYNC_COMMITS)}")
    if pg.get("fsync", "") != "on":
        out.append(f"PostgreSQL fsync={pg.get('fsync', '')}, needs on")
    return out


def topic_durability(
    kafka: KafkaSettings, names: Iterable[str], timeout_s: float = 10.0
) -> dict[str, TopicDurability | None]:
    """Each topic's replication and the configuration that governs its durability."""
    admin = AdminClient(admin_config(kafka))
    names = list(names)
    meta = admin.list_topics(timeout=timeout_s).topics
    present = [n for n in names if n in meta and meta[n].error is None]
    out: dict[str, TopicDurability | None] = dict.fromkeys(names)
    if not present:
        return out
    futures = admin.describe_configs(
        [ConfigResource(ResourceType.TOPIC, n) for n in present], request_timeout=timeout_s
    )
    for resource, fut in futures.items():
        configs = fut.result(timeout=timeout_s)
        name = resource.name
        replicas = [len(p.replicas) for p in meta[name].partitions.values()]
        out[name] = TopicDurability(
            replication=min(replicas, default=0),
            min_insync=int(configs["min.insync.replicas"].value),
            unclean_election=configs["unclean.leader.election.enable"].value == "true",
        )
    return out
