"""Kafka TLS/SASL settings, the librdkafka configuration they make, and the proxies whose
X-Forwarded-* headers are believed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.config import settings_from_env
from core.kafka import client_config, security_config


def test_plaintext_by_default_adds_only_the_protocol() -> None:
    assert security_config(settings_from_env({})) == {"security.protocol": "PLAINTEXT"}


def test_every_client_config_carries_the_security_settings() -> None:
    s = settings_from_env(
        {
            "KAFKA_BOOTSTRAP": "k:9093",
            "GRISTMILL_KAFKA_SECURITY_PROTOCOL": "SSL",
            "GRISTMILL_KAFKA_SSL_CA_LOCATION": "/ca.pem",
        }
    )
    assert client_config(s) == {
        "bootstrap.servers": "k:9093",
        "security.protocol": "SSL",
        "ssl.ca.location": "/ca.pem",
        "ssl.endpoint.identification.algorithm": "https",
    }


def test_sasl_ssl_with_scram_and_a_private_ca() -> None:
    s = settings_from_env(
        {
            "GRISTMILL_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "GRISTMILL_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
            "GRISTMILL_KAFKA_SASL_USERNAME": "gristmill",
            "GRISTMILL_KAFKA_SASL_PASSWORD": "s3cret",
            "GRISTMILL_KAFKA_SSL_CA_LOCATION": "/etc/ca.pem",
        }
    )
    assert security_config(s) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "gristmill",
        "sasl.password": "s3cret",
        "ssl.ca.location": "/etc/ca.pem",
        "ssl.endpoint.identification.algorithm": "https",
    }
    assert "s3cret" not in repr(s)  # a secret never lands in a log line


def test_mtls_without_hostname_check() -> None:
    s = settings_from_env(
        {
            "GRISTMILL_KAFKA_SECURITY_PROTOCOL": "SSL",
            "GRISTMILL_KAFKA_SSL_CERTIFICATE_LOCATION": "/c.pem",
            "GRISTMILL_KAFKA_SSL_KEY_LOCATION": "/k.pem",
            "GRISTMILL_KAFKA_SSL_VERIFY_HOSTNAME": "false",
        }
    )
    conf = security_config(s)
    assert conf["ssl.certificate.location"] == "/c.pem"
    assert conf["ssl.key.location"] == "/k.pem"
    assert conf["ssl.endpoint.identification.algorithm"] == "none"
    assert "sasl.mechanism" not in conf


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"GRISTMILL_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "kafka_sasl_username"),
        (
            {"GRISTMILL_KAFKA_SECURITY_PROTOCOL": "SSL", "GRISTMILL_KAFKA_SSL_KEY_LOCATION": "/k"},
            "kafka_ssl_certificate_location",
        ),
        ({"GRISTMILL_KAFKA_SSL_CA_LOCATION": "/ca.pem"}, "does not use TLS"),
        ({"GRISTMILL_KAFKA_SECURITY_PROTOCOL": "TLS"}, "kafka_security_protocol"),
        ({"GRISTMILL_KAFKA_SASL_MECHANISM": "GSSAPI"}, "kafka_sasl_mechanism"),
        ({"GRISTMILL_FORWARDED_ALLOW_IPS": "10.0.0.0/8,proxy.local"}, "proxy.local"),
    ],
)
def test_inconsistent_settings_are_refused_naming_the_field(
    env: dict[str, str], named: str
) -> None:
    with pytest.raises(ValidationError, match=named):
        settings_from_env(env)


def test_forwarded_allow_ips_takes_addresses_networks_and_star() -> None:
    for value in ("", "*", "10.0.0.1", "10.0.0.0/8, 2001:db8::/32"):
        s = settings_from_env({"GRISTMILL_FORWARDED_ALLOW_IPS": value})
        assert s.forwarded_allow_ips == value
