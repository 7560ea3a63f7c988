"""Secured local services for tests: a private CA and server certificate made with
openssl, a SASL_SSL client listener on the local Kafka (SCRAM and PLAIN), and PostgreSQL
with ``ssl = on`` that takes only TLS connections authenticated by scram-sha-256.

    tls = make_tls_files(workdir / "tls")
    kafka = KafkaCluster(dir, secure=SaslSslListener(tls, plain_users={"app": "pw"}))
    kafka.start(); add_scram_user(kafka.bootstrap, "app", "pw")
    # clients: kafka.secure_bootstrap, security.protocol SASL_SSL, ssl.ca.location tls.ca_cert
    url = secure_postgres(pg, tls, "pw")     # verify-full URL for DATABASE_URL
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gristmill.devservices.postgres import DB_NAME, DB_USER, PG_SYSTEM_USER, PostgresServer

# Long enough for any test run, short enough that a leaked key is soon useless.
CERT_DAYS = 2
# The iteration count Kafka's own tools default to for SCRAM credentials.
SCRAM_ITERATIONS = 4096


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the CA's certificate, the server's certificate and its (unencrypted
    PKCS#8) key, and the two concatenated (a Kafka PEM keystore)."""

    ca_cert: Path
    cert: Path
    key: Path
    keystore: Path


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def make_tls_files(
    directory: Path,
    *,
    dns_names: Sequence[str] = ("localhost",),
    ips: Sequence[str] = ("127.0.0.1", "::1"),
) -> TlsFiles:
    """A throwaway CA and a server certificate it signed for ``dns_names`` and ``ips``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    days = str(CERT_DAYS)
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
             "-out", "ca.key", cwd=d)  # fmt: skip
    _openssl("req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", days,
             "-subj", "/CN=gristmill test CA", "-out", "ca.crt", cwd=d)  # fmt: skip
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
             "-out", "server.key", cwd=d)  # fmt: skip
    _openssl("req", "-new", "-key", "server.key", "-subj", "/CN=localhost",
             "-out", "server.csr", cwd=d)  # fmt: skip
    san = ",".join([*(f"DNS:{n}" for n in dns_names), *(f"IP:{ip}" for ip in ips)])
    (d / "server.ext").write_text(
        f"subjectAltName={san}\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,"
        "keyEncipherment\nbasicConstraints=CA:FALSE\n"
    )
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", days, "-sha256", "-extfile", "server.ext",
             "-out", "server.crt", cwd=d)  # fmt: skip
    keystore = d / "server.keystore.pem"
    keystore.write_text((d / "server.key").read_text() + (d / "server.crt").read_text())
    for secret in (d / "ca.key", d / "server.key", keystore):
        secret.chmod(0o600)
    return TlsFiles(d / "ca.crt", d / "server.crt", d / "server.key", keystore)


@dataclass(frozen=True)
class SaslSslListener:
    """A client listener that takes TLS and a SASL login (SCRAM-SHA-256/512 users are
    added with :func:`add_scram_user` once the broker runs; PLAIN users are listed here).
    The PLAINTEXT listener stays for the brokers' own traffic and the readiness probe."""

    tls: TlsFiles
    plain_users: Mapping[str, str] = field(default_factory=dict)

    def properties(
        self, host: str, port: int, controller_port: int, secure_port: int
    ) -> dict[str, object]:
        plain = " ".join(f'user_{u}="{p}"' for u, p in self.plain_users.items())
        return {
            "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port},"
            f"SASL_SSL://{host}:{secure_port}",
            "advertised.listeners": f"PLAINTEXT://{host}:{port},SASL_SSL://{host}:{secure_port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,"
            "SASL_SSL:SASL_SSL",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "listener.name.sasl_ssl.plain.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain};"
            ),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": self.tls.keystore,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": self.tls.ca_cert,
        }


def add_scram_user(bootstrap: str, user: str, password: str, timeout_s: float = 30) -> None:
    """SCRAM-SHA-256 and -512 credentials for ``user``, through the PLAINTEXT listener."""
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialAlteration,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    # One request per mechanism: a request may alter a user's credentials only once.
    for mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):
        upsert: list[UserScramCredentialAlteration] = [
            UserScramCredentialUpsertion(
                user, ScramCredentialInfo(mechanism, SCRAM_ITERATIONS), password.encode()
            )
        ]
        for fut in admin.alter_user_scram_credentials(upsert).values():
            fut.result(timeout=timeout_s)


def secure_postgres(pg: PostgresServer, tls: TlsFiles, password: str) -> str:
    """Give ``gristmill`` a scram-sha-256 password, turn ``ssl`` on with ``tls``'s
    certificate, and take only TLS connections with that password (everything else is
    rejected). Returns the verify-full URL. Run on a started server; its ``start()``
    cannot be used on it again (that logs in without TLS)."""
    import psycopg

    owner = pwd.getpwnam(PG_SYSTEM_USER) if os.geteuid() == 0 else None
    for name, src in (("server.crt", tls.cert), ("server.key", tls.key)):
        dst = pg.data_dir / name
        dst.write_bytes(src.read_bytes())
        dst.chmod(0o600)  # PostgreSQL refuses a key others can read
        if owner is not None:
            os.chown(dst, owner.pw_uid, owner.pw_gid)
    conninfo = f"host=127.0.0.1 port={pg.port} user={DB_USER} dbname={DB_NAME}"
    with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
        conn.execute("SET password_encryption = 'scram-sha-256'")
        conn.execute(
            psycopg.sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                psycopg.sql.Identifier(DB_USER), psycopg.sql.Literal(password)
            )
        )
        conn.execute("ALTER SYSTEM SET ssl_cert_file = 'server.crt'")
        conn.execute("ALTER SYSTEM SET ssl_key_file = 'server.key'")
        conn.execute("ALTER SYSTEM SET ssl = on")
        hba = pg.data_dir / "pg_hba.conf"
        hba.write_text(
            "# gristmill devservices: TLS + scram-sha-256 only\n"
            "hostssl all all 127.0.0.1/32 scram-sha-256\n"
            "hostssl all all ::1/128 scram-sha-256\n"
            "hostnossl all all all reject\n"
        )
        if owner is not None:
            os.chown(hba, owner.pw_uid, owner.pw_gid)
        conn.execute("SELECT pg_reload_conf()")
    return (
        f"postgresql://{DB_USER}:{password}@127.0.0.1:{pg.port}/{DB_NAME}"
        f"?sslmode=verify-full&sslrootcert={tls.ca_cert}"
    )
