"""Throwaway local servers for development and tests: Kafka (KRaft, from plain jars) and
PostgreSQL (initdb + pg_ctl), each in its own work directory and process group.

``python -m gristmill.devservices up`` starts both and prints their addresses.
"""

from gristmill.devservices.kafka import KafkaBroker, KafkaCluster, KafkaStartError
from gristmill.devservices.kafka_jars import ensure_kafka_jars
from gristmill.devservices.ports import free_port, wait_for_port
from gristmill.devservices.postgres import PostgresError, PostgresServer

__all__ = [
    "KafkaBroker",
    "KafkaCluster",
    "KafkaStartError",
    "PostgresError",
    "PostgresServer",
    "ensure_kafka_jars",
    "free_port",
    "wait_for_port",
]
