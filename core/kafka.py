"""The one place Kafka client configurations are made.

Every producer, consumer and admin client of every process takes its librdkafka
configuration from here, so what they all need (where the brokers are, and later
how to reach them securely) is written once. Callers add only what is theirs
(a group id, batching, timeouts) as ``extra``.
"""

from __future__ import annotations

from typing import Any

from core.config import KafkaSettings

Config = dict[str, Any]
# Message headers as confluent-kafka takes them (e.g. the W3C trace context).
KafkaHeaders = list[tuple[str, str | bytes | None]]


def client_config(kafka: KafkaSettings) -> Config:
    """What every client of the cluster needs: the brokers and how to reach them
    (TLS and SASL when the cluster asks for them)."""
    return {"bootstrap.servers": kafka.kafka_bootstrap, **security_config(kafka)}


def security_config(k: KafkaSettings) -> Config:
    conf: Config = {"security.protocol": k.kafka_security_protocol}
    if k.kafka_security_protocol.startswith("SASL_"):
        conf["sasl.mechanism"] = k.kafka_sasl_mechanism
        conf["sasl.username"] = k.kafka_sasl_username
        conf["sasl.password"] = k.kafka_sasl_password.get_secret_value()
    if k.kafka_security_protocol in ("SSL", "SASL_SSL"):
        if k.kafka_ssl_ca_location:
            conf["ssl.ca.location"] = k.kafka_ssl_ca_location
        if k.kafka_ssl_certificate_location:
            conf["ssl.certificate.location"] = k.kafka_ssl_certificate_location
            conf["ssl.key.location"] = k.kafka_ssl_key_location
        if k.kafka_ssl_key_password.get_secret_value():
            conf["ssl.key.password"] = k.kafka_ssl_key_password.get_secret_value()
        conf["ssl.endpoint.identification.algorithm"] = (
            "https" if k.kafka_ssl_verify_hostname else "none"
        )
    return conf


def producer_config(kafka: KafkaSettings, **extra: Any) -> Config:
    """A producer whose retries never duplicate or reorder a message (idempotent) and
    whose acknowledgment means every in-sync replica has it (acks=all): an accepted
    request is durable (decision 1)."""
    return {**client_config(kafka), "enable.idempotence": True, "acks": "all", **extra}


def consumer_config(kafka: KafkaSettings, group_id: str, **extra: Any) -> Config:
    return {**client_config(kafka), "group.id": group_id, **extra}


def admin_config(kafka: KafkaSettings, **extra: Any) -> Config:
    return {**client_config(kafka), **extra}
