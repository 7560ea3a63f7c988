"""ingest/native/wire.py: malformed JSON is 400, a schema violation 422, naming the field; what
POST /v1/infer accepts is checked before any model, Kafka or PostgreSQL sees it."""

from __future__ import annotations

import time

import orjson
import pytest

from core.config import Settings
from core.errors import GristmillError, InvalidInput, SchemaViolation
from core.messages import RequestMessage, body_hash
from core.models.catalog import build_specs
from ingest.acceptance.message import request_message
from ingest.acceptance.pipeline import check_headers
from ingest.edge.bodies import parse_body
from ingest.native.wire import InferBody, accept, infer_request_schema, parse_infer
from results.tenants import Tenant

SETTINGS = Settings()
SPECS = build_specs(SETTINGS)


def refusal(body: bytes | str, settings: Settings = SETTINGS) -> tuple[int, str | None]:
    raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    try:
        parsed = parse_infer(raw, settings)
        name, _, version = parsed.model.partition("@")
        accept(SPECS[name][version or "1"], parsed)
    except GristmillError as exc:
        return exc.status, exc.field
    return 200, None


@pytest.mark.parametrize(
    "body,field",
    [
        ('{"model": "sim", "input": "a\\u0000b"}', "input"),
        ('{"model": "sim", "input": "\\u0000"}', "input"),
        ('{"model": "sim", "input": "x", "params": {"salt": "\\u0000"}}', "params.salt"),
        ('{"model": "sim", "input": "x", "params": {"\\u0000": "y"}}', "params"),
        ('{"model": "sim\\u0000", "input": "x"}', "model"),
        (
            '{"model": "all-minilm-l6-v2", "input": "x", "params": {"normalize": "\\u0000"}}',
            "params.normalize",
        ),
        ('{"model": "sim", "input": ["a", {"b": "\\u0000"}]}', "input[1].b"),
        ('{"model": "sim", "input": {"k": 1e308, "j": [1, 2, 18446744073709551615]}}', "input"),
        ('{"model": "sim", "input": "' + "x" * 20_001 + '"}', "input"),
        ('{"model": "' + "m" * 201 + '", "input": "x"}', "model"),
        (
            '{"model": "sim", "input": "x", "params": {"salt": "' + "s" * 1_001 + '"}}',
            "params.salt",
        ),
        ('{"model": "sim", "input": "x", "params": {"pad": "' + "p" * 5_000 + '"}}', "params"),
        ('{"model": "sim", "input": "x", "timeout_ms": 300001}', "timeout_ms"),
        ('{"model": "sim", "input": "x", "timeout_ms": 9223372036854775808}', "timeout_ms"),
        ('{"model": "sim", "input": "   "}', "input"),
        ('{"model": "sim", "input": 7}', "input"),
    ],
)
def test_what_cannot_be_carried_or_breaks_a_cap_is_400_naming_the_field(
    body: str, field: str
) -> None:
    status, got = refusal(body)
    assert status == 400 and got == field


def test_nesting_past_the_cap_is_400() -> None:
    deep = '{"model": "sim", "input": ' + "[" * 40 + "]" * 40 + "}"
    assert refusal(deep) == (400, "input" + "[0]" * 32)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "sim", "input": "\\ud800"}',  # a lone surrogate escape
        b'{"model": "sim", "input": "\xed\xa0\x80"}',  # a surrogate in UTF-8 bytes
        b'{"model": "sim", "input": "\xff"}',  # not UTF-8 at all
        b'{"model": "sim", "input": "x", "timeout_ms": NaN}',
        b'{"model": "sim", "input": "x", "timeout_ms": 1e400}',
        b"[" * 2000 + b"]" * 2000,
    ],
)
def test_what_the_parser_refuses_is_400(raw: bytes) -> None:
    assert refusal(raw)[0] == 400


@pytest.mark.parametrize(
    "body",
    [
        '{"model": "sim", "input": "plain"}',
        '{"model": "sim@1", "input": "\\u00e9\\u4e2d\\ud83d\\ude00 \\u0001\\u007f"}',
        '{"model": "sim", "input": "x", "params": {"salt": ""}, "timeout_ms": 1}',
        '{"model": "all-minilm-l6-v2", "input": "x", "params": {"normalize": false}}',
        '{"model": "sim", "input": "' + "x" * 20_000 + '", "timeout_ms": 300000}',
    ],
)
def test_ordinary_bodies_pass(body: str) -> None:
    assert refusal(body) == (200, None)


@pytest.mark.parametrize("key", ["k" * 256, "", "caf\u00e9", "a\x00b", "line\nbreak"])
def test_idempotency_keys_are_checked_from_the_header(key: str) -> None:
    with pytest.raises(GristmillError) as info:
        check_headers(SETTINGS, key)
    assert info.value.status == 400 and info.value.field == "Idempotency-Key"


def test_the_caps_come_from_settings() -> None:
    tight = Settings(max_input_chars=5, max_model_chars=3, max_params_bytes=10)
    specs = build_specs(tight)
    body = parse_infer(b'{"model": "sim", "input": "123456"}', tight)
    with pytest.raises(GristmillError):
        accept(specs["sim"]["1"], body)
    assert refusal(b'{"model": "simx", "input": "x"}', tight) == (400, "model")
    params = b'{"model": "sim", "input": "x", "params": {"salt": "0123456789"}}'
    assert refusal(params, tight) == (400, "params")


def test_an_accepted_body_becomes_a_message_kafka_can_carry() -> None:
    body = parse_infer(
        b'{"model": "sim", "input": "h\\u00e9llo \\ud83d\\ude00", "params": {"salt": "s"}}',
        SETTINGS,
    )
    spec = SPECS["sim"]["1"]
    params = accept(spec, body)
    now = time.time()
    msg = request_message(
        spec,
        body.input,
        params,
        tenant=Tenant("t", "t", "free"),
        request_id="r",
        received=now,
        timeout_ms=1500,
        fingerprint=body_hash(body.model, body.input, body.params or {}),
    )
    back = RequestMessage.decode(msg.encode())
    assert back.input == "h\u00e9llo \U0001f600" and back.params == {"salt": "s"}
    assert back.deadline == pytest.approx(now + 1.5) and back.body_hash
    assert back.priority == "free" and back.version == "1"


def test_the_declared_schema_carries_the_caps() -> None:
    schema = infer_request_schema(SETTINGS, ["sim@1"])
    props = schema["properties"]
    assert props["model"]["enum"] == ["sim@1"]
    assert props["input"]["maxLength"] == SETTINGS.max_input_chars
    assert props["timeout_ms"]["maximum"] == SETTINGS.max_timeout_ms
    assert schema["additionalProperties"] is False
    orjson.dumps(schema)


def test_a_valid_body_parses() -> None:
    body = parse_body(b'{"model": "sim", "input": "hi", "timeout_ms": 500}', InferBody)
    assert (body.model, body.input, body.timeout_ms, body.params) == ("sim", "hi", 500, None)


@pytest.mark.parametrize("raw", [b"", b"   ", b"{not json", b"[1, 2]", b'"text"'])
def test_not_a_json_object_is_400(raw: bytes) -> None:
    with pytest.raises(InvalidInput):
        parse_body(raw, InferBody)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"model": "sim"}', "input"),
        (b'{"model": "", "input": "x"}', "model"),
        (b'{"model": "sim", "input": "x", "timeout_ms": 0}', "timeout_ms"),
        (b'{"model": "sim", "input": "x", "timeout_ms": "5"}', "timeout_ms"),
        (b'{"model": "sim", "input": "x", "colour": "red"}', "colour"),
        (b'{"model": "sim", "input": "x", "params": [1]}', "params"),
    ],
)
def test_a_schema_violation_is_422_naming_the_field(raw: bytes, field: str) -> None:
    with pytest.raises(SchemaViolation) as err:
        parse_body(raw, InferBody)
    assert err.value.status == 422 and err.value.field == field
