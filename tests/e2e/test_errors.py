"""Every client mistake gets a clear 4xx naming the problem; dependency trouble is 503."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from gristmill.devservices import free_port
from gristmill.devservices.stack import System


def post(
    system: System,
    content: bytes | str,
    headers: dict[str, str] | None = None,
    url: str | None = None,
) -> httpx.Response:
    return httpx.post(
        f"{url or system.url}/v1/infer",
        content=content,
        headers={"Content-Type": "application/json", **system.headers(), **(headers or {})},
        timeout=30,
    )


def error(r: httpx.Response) -> dict[str, str]:
    err: dict[str, str] = r.json()["error"]
    return err


def test_malformed_json_is_400(system: System) -> None:
    r = post(system, b'{"model": "sim", "input": ')
    assert r.status_code == 400 and "JSON" in error(r)["message"]


def test_body_not_an_object_is_400(system: System) -> None:
    assert post(system, b'["sim"]').status_code == 400


@pytest.mark.parametrize(
    "body,field",
    [
        ('{"input": "x"}', "model"),
        ('{"model": "sim"}', "input"),
        ('{"model": 3, "input": "x"}', "model"),
        ('{"model": "sim", "input": "x", "timeout_ms": "soon"}', "timeout_ms"),
        ('{"model": "sim", "input": "x", "timeout_ms": -5}', "timeout_ms"),
        ('{"model": "sim", "input": "x", "params": []}', "params"),
        ('{"model": "sim", "input": "x", "surprise": 1}', "surprise"),
    ],
)
def test_schema_violations_are_422_naming_the_field(system: System, body: str, field: str) -> None:
    r = post(system, body)
    assert r.status_code == 422, r.text
    assert error(r)["field"] == field


@pytest.mark.parametrize(
    "body,field,status",
    [
        ('{"model": "sim", "input": ""}', "input", 400),
        ('{"model": "sim", "input": 42}', "input", 400),
        ('{"model": "sim", "input": "x", "params": {"salt": 1}}', "params.salt", 400),
        ('{"model": "sim", "input": "x", "params": {"nope": 1}}', "params.nope", 400),
        ('{"model": "sim", "input": "x", "timeout_ms": 999999999}', "timeout_ms", 400),
    ],
)
def test_invalid_values_are_400_naming_the_field(
    system: System, body: str, field: str, status: int
) -> None:
    r = post(system, body)
    assert r.status_code == status, r.text
    assert error(r)["field"] == field


def test_oversized_input_is_400(system: System) -> None:
    r = post(system, '{"model": "sim", "input": "' + "x" * 25_000 + '"}')
    assert r.status_code == 400 and error(r)["field"] == "input"


def test_body_too_large_is_413(system: System) -> None:
    r = post(system, '{"model": "sim", "input": "' + "x" * 1_100_000 + '"}')
    assert r.status_code == 413


def test_streamed_body_too_large_is_413(system: System) -> None:
    # No Content-Length: the cap is enforced while the chunks arrive.
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "sim", "input": "'
        for _ in range(40):
            yield b"x" * 30_000
        yield b'"}'

    r = httpx.post(
        f"{system.url}/v1/infer",
        content=chunks(),
        headers={"Content-Type": "application/json", **system.headers()},
        timeout=30,
    )
    assert r.status_code == 413 and error(r)["code"] == "payload_too_large"


def test_infer_is_documented_and_other_methods_are_405(system: System) -> None:
    # POST /v1/infer is served in front of FastAPI (ingest/fast_path.py); the rest of
    # the route's HTTP surface is still FastAPI's.
    assert "/v1/infer" in httpx.get(f"{system.url}/openapi.json").json()["paths"]
    assert httpx.get(f"{system.url}/v1/infer", headers=system.headers()).status_code == 405


def test_missing_key_is_401(system: System) -> None:
    r = httpx.post(f"{system.url}/v1/infer", json={"model": "sim", "input": "x"})
    assert r.status_code == 401 and "Authorization" in error(r)["message"]


def test_unknown_key_is_401(system: System) -> None:
    r = post(system, '{"model": "sim", "input": "x"}', headers={"Authorization": "Bearer gm_nope"})
    assert r.status_code == 401


def test_unknown_model_is_404(system: System) -> None:
    r = post(system, '{"model": "gpt-17", "input": "x"}')
    assert r.status_code == 404 and error(r)["field"] == "model"
    assert post(system, '{"model": "sim@99", "input": "x"}').status_code == 404


def test_overlong_idempotency_key_is_400(system: System) -> None:
    r = post(system, '{"model": "sim", "input": "x"}', headers={"Idempotency-Key": "k" * 300})
    assert r.status_code == 400


def test_kafka_unreachable_is_503_with_retry_after(system: System) -> None:
    dead = f"127.0.0.1:{free_port()}"
    url = system.start_api(
        "api-no-kafka", env={"KAFKA_BOOTSTRAP": dead, "GRISTMILL_PRODUCE_TIMEOUT_MS": "1500"}
    )
    try:
        r = post(system, '{"model": "sim", "input": "x"}', url=url)
        assert r.status_code == 503 and "Retry-After" in r.headers
        assert "Kafka" in error(r)["message"]
    finally:
        system.stop("api-no-kafka")


def test_postgres_unreachable_is_503_with_retry_after(system: System) -> None:
    dead = f"postgresql+psycopg://gristmill@127.0.0.1:{free_port()}/gristmill"
    url = system.start_api("api-no-db", env={"DATABASE_URL": dead})
    try:
        r = post(system, '{"model": "sim", "input": "x"}', url=url)
        assert r.status_code == 503 and "Retry-After" in r.headers
    finally:
        system.stop("api-no-db")


def test_no_traceback_ever_leaks(system: System) -> None:
    for body in (b"\xff\xfe", b"null", b'{"model": null, "input": null}', b"{}"):
        r = post(system, body)
        assert 400 <= r.status_code < 500, (body, r.status_code)
        assert "Traceback" not in r.text
