"""Where Kafka and PostgreSQL are and how requests are made durable."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    model_validator,
)

from core.config._base import _Concern


class KafkaSettings(_Concern):
    """Where Kafka is and how request topics are laid out (core/kafka.py, core/topics.py)."""

    kafka_bootstrap: str = Field(
        "127.0.0.1:9092",
        min_length=1,
        validation_alias=AliasChoices("KAFKA_BOOTSTRAP", "GRISTMILL_KAFKA_BOOTSTRAP"),
    )
    topic_prefix: str = Field("gristmill", min_length=1)
    topic_partitions: int = Field(6, ge=1)
    topic_replication: int = Field(1, ge=1)

    # How every client reaches the brokers: TLS and SASL (core/kafka.py turns these into
    # librdkafka's settings; docs/deploy.md, "Secured connections").
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "SCRAM-SHA-512"
    kafka_sasl_username: str = ""
    kafka_sasl_password: SecretStr = SecretStr("")
    # PEM file of the CA that signed the brokers' certificates; empty: the system's CAs.
    kafka_ssl_ca_location: str = ""
    # mTLS: the client's certificate and private key (PEM files), and the key's password.
    kafka_ssl_certificate_location: str = ""
    kafka_ssl_key_location: str = ""
    kafka_ssl_key_password: SecretStr = SecretStr("")
    # Check that a broker's certificate names the host it was reached at.
    kafka_ssl_verify_hostname: bool = True

    @model_validator(mode="after")
    def _security_consistent(self) -> Self:
        protocol = self.kafka_security_protocol
        sasl = protocol.startswith("SASL_")
        if sasl and not (self.kafka_sasl_username and self.kafka_sasl_password.get_secret_value()):
            raise ValueError(
                f"kafka_security_protocol {protocol} needs kafka_sasl_username and "
                "kafka_sasl_password"
            )
        if bool(self.kafka_ssl_certificate_location) != bool(self.kafka_ssl_key_location):
            raise ValueError(
                "kafka_ssl_certificate_location and kafka_ssl_key_location go together "
                "(a client certificate needs its key)"
            )
        tls = protocol in ("SSL", "SASL_SSL")
        if not tls and (self.kafka_ssl_ca_location or self.kafka_ssl_certificate_location):
            raise ValueError(
                f"kafka_ssl_* files are set but kafka_security_protocol {protocol} does not "
                "use TLS (SSL or SASL_SSL)"
            )
        return self


class DurabilitySettings(_Concern):
    """What Kafka and PostgreSQL must promise before a process serves."""

    # Outside development the API and the scheduler refuse to start unless the request
    # topics keep 3 replicas with 2 in sync and PostgreSQL commits synchronously
    # (core/durability.py, decision 0020). True runs on weaker settings: one local
    # broker, a throwaway database (`gristmill dev`, tests, docker/compose.yaml).
    allow_weak_durability: bool = False


class DatabaseSettings(_Concern):
    database_url: str = Field(
        "postgresql+psycopg://gristmill@127.0.0.1:5432/gristmill",
        min_length=1,
        validation_alias=AliasChoices("DATABASE_URL", "GRISTMILL_DATABASE_URL"),
    )
