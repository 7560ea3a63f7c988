"""Kafka over SASL_SSL (SCRAM and PLAIN) and PostgreSQL with ssl = on and scram-sha-256,
with certificates made here by openssl: the sync path, a job and `gristmill doctor` run
through them, and the servers refuse what is not secured."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from gristmill.devservices import KafkaCluster, PostgresServer
from gristmill.devservices.stack import REPO, Services, System, build_system
from gristmill.devservices.tls import (
    SaslSslListener,
    TlsFiles,
    add_scram_user,
    make_tls_files,
    secure_postgres,
)

USER, PASSWORD = "gristmill", "kafka-s3cret"
PLAIN_USER, PLAIN_PASSWORD = "plain-client", "plain-s3cret"
PG_PASSWORD = "pg-s3cret"

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


class Secured:
    def __init__(self, system: System, tls: TlsFiles, kafka: KafkaCluster, pg: PostgresServer):
        self.system, self.tls, self.kafka, self.pg = system, tls, kafka, pg


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    work = tmp_path_factory.mktemp("secure")
    tls = make_tls_files(work / "tls")
    kafka = KafkaCluster(
        work / "kafka", secure=SaslSslListener(tls, plain_users={PLAIN_USER: PLAIN_PASSWORD})
    )
    pg_dir = Path(tempfile.mkdtemp(prefix="gristmill-pg-"))
    pg_dir.chmod(0o711)  # PostgreSQL runs as its own user (see local_services)
    pg = PostgresServer(pg_dir, fast=False)
    system = None
    try:
        kafka.start()
        add_scram_user(kafka.bootstrap, USER, PASSWORD)
        pg.start()
        url = secure_postgres(pg, tls, PG_PASSWORD)
        system = build_system(
            Services(kafka.secure_bootstrap, url),
            work,
            extra_env={
                "GRISTMILL_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "GRISTMILL_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                "GRISTMILL_KAFKA_SASL_USERNAME": USER,
                "GRISTMILL_KAFKA_SASL_PASSWORD": PASSWORD,
                "GRISTMILL_KAFKA_SSL_CA_LOCATION": str(tls.ca_cert),
            },
        )
        system.start_scheduler(workers=1, models="sim")
        system.url = system.start_api()
        system.wait_until_serving("sim")
        yield Secured(system, tls, kafka, pg)
    finally:
        if system is not None:
            system.close()
        kafka.stop()
        pg.stop()
        shutil.rmtree(pg_dir, ignore_errors=True)


def test_sync_request_and_job_run_over_tls_and_sasl(secured: Secured) -> None:
    s = secured.system
    # The first enterprise request: that class's consumer may still be joining its group
    # over SASL_SSL (the warm-up went through another tier's). About TLS, not latency:
    # it may wait for that instead of its tier's 1 s default (one CI run saw a 504).
    r = httpx.post(
        f"{s.url}/v1/infer",
        headers=s.headers("enterprise"),
        json={"model": "sim", "input": "over tls", "timeout_ms": 30_000},
        timeout=40,
    )
    assert r.status_code == 200, r.text
    assert r.json()["output"]["chars"] == len("over tls")
    items = [{"custom_id": f"i{i}", "input": f"item {i}"} for i in range(20)]
    r = httpx.post(
        f"{s.url}/v1/jobs",
        headers=s.headers("paid"),
        json={"model": "sim", "items": items},
        timeout=30,
    )
    assert r.status_code == 202, r.text
    job = r.json()["job_id"]
    deadline = time.time() + 60
    status = {}
    while time.time() < deadline:
        status = httpx.get(f"{s.url}/v1/jobs/{job}", headers=s.headers("paid"), timeout=10).json()
        if status["status"] == "completed":
            break
        time.sleep(0.5)
    assert status["status"] == "completed", status
    # The rows were written through the TLS connection: PostgreSQL says so for its sessions.
    with psycopg.connect(s.env["DATABASE_URL"], autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE NOT ssl), count(*) FROM pg_stat_ssl s "
            "JOIN pg_stat_activity a USING (pid) WHERE a.datname = current_database()"
        ).fetchone()
        assert row is not None and row[0] == 0 and row[1] >= 2
        done = conn.execute(
            "SELECT count(*) FROM requests WHERE job_id = %s AND status = 'succeeded'", (job,)
        ).fetchone()
        assert done is not None and done[0] == 20


def test_servers_refuse_what_is_not_secured(secured: Secured) -> None:
    url = secured.system.env["DATABASE_URL"]
    plain_pg = url.split("?")[0] + "?sslmode=disable"
    with pytest.raises(psycopg.OperationalError, match="no encryption"):
        psycopg.connect(plain_pg, connect_timeout=10).close()
    bad_pw = url.replace(PG_PASSWORD, "wrong")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(bad_pw, connect_timeout=10).close()

    def metadata(**conf: str) -> int:
        admin = AdminClient({"bootstrap.servers": secured.kafka.secure_bootstrap, **conf})
        return len(admin.list_topics(timeout=8).brokers)

    tls = {"security.protocol": "SASL_SSL", "ssl.ca.location": str(secured.tls.ca_cert)}
    assert metadata(**tls, **_sasl("PLAIN", PLAIN_USER, PLAIN_PASSWORD)) == 1
    assert metadata(**tls, **_sasl("SCRAM-SHA-256", USER, PASSWORD)) == 1
    with pytest.raises(Exception):  # noqa: B017 - librdkafka reports it as a timeout
        metadata(**tls, **_sasl("SCRAM-SHA-512", USER, "wrong"))
    with pytest.raises(Exception):  # noqa: B017
        metadata(**{"security.protocol": "PLAINTEXT"})


def _sasl(mechanism: str, user: str, password: str) -> dict[str, str]:
    return {"sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password}


def _doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gristmill.cli.doctor", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_doctor_passes_on_the_secured_stack_and_names_what_breaks(secured: Secured) -> None:
    env = secured.system.env
    good = _doctor(env)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "over SASL_SSL" in good.stdout
    assert "with TLS (sslmode verify-full)" in good.stdout
    assert "sim@1: live workers under 1 scheduler(s)" in good.stdout
    assert "(head)" in good.stdout

    bad_kafka = _doctor({**env, "GRISTMILL_KAFKA_SASL_PASSWORD": "wrong"})
    assert bad_kafka.returncode == 1
    assert "refused the SASL login of user 'gristmill'" in bad_kafka.stdout

    unverified = {**env, "DATABASE_URL": env["DATABASE_URL"].split("?")[0]}
    risky = _doctor(unverified)  # libpq's default: TLS if offered, certificate unchecked
    assert risky.returncode == 0 and "sslmode prefer" in risky.stdout
    assert _doctor(unverified, "--strict").returncode == 1

    plain_pg = _doctor(
        {**env, "DATABASE_URL": env["DATABASE_URL"].split("?")[0] + "?sslmode=disable"}
    )
    assert plain_pg.returncode == 1
    assert "only TLS connections" in plain_pg.stdout
