"""Property: any body the API accepts can be carried by Kafka, stored in PostgreSQL and
answered. Generated bodies (hostile strings, numbers, nesting, headers) go through the
API's own validation (ingest/native/wire.py, the model specs, ingest/native/routes.py); each one
accepted becomes the Kafka message, is decoded as the scheduler would, is written as
the persister writes it (the idempotency claim, the request row and the batch row)
into a real PostgreSQL, and is read back as the API answers it."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, NullPool, select
from sqlalchemy.ext.asyncio import create_async_engine

from core.config import Settings, settings_from_env
from core.errors import GristmillError
from core.messages import RequestMessage, body_hash
from core.models.catalog import build_specs
from core.models.sim import sim_output
from core.models.token_ids import input_text
from gristmill.devservices.stack import Services
from gristmill.migrate import migrate_database
from ingest.acceptance.idempotency import claim
from ingest.acceptance.message import request_message
from ingest.acceptance.pipeline import check_headers
from ingest.native.wire import accept, parse_infer, result_body
from results.db import make_engine, sqlalchemy_url
from results.requests import RESULT_COLUMNS
from results.schema import idempotency_keys, requests
from results.store import write_results
from results.tenants import Tenant, create_tenant
from scheduler.core.batcher import Batch, BatchKey, Pending
from scheduler.runtime.rows import batch_row, succeeded_rows

SETTINGS = Settings()
SPECS = build_specs(SETTINGS)

# Mostly ordinary values, each field now and then hostile: every code point (surrogates
# and U+0000 included), numbers past what JSON, PostgreSQL or Kafka hold, nesting, sizes
# past the caps. Most bodies are accepted, so the property is about many stored rows.
any_char = st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=())
ordinary_char = st.characters(min_codepoint=1, max_codepoint=0x10FFFF, exclude_categories=("Cs",))
hostile_char = st.sampled_from(["\x00", "\ud800", "\udfff", "\x7f", "\u2028", "\ufeff", "\uffff"])
ordinary = st.text(ordinary_char, min_size=1, max_size=40)
hostile = st.text(st.one_of(any_char, hostile_char), max_size=40) | st.sampled_from(
    ["", " ", "x" * 1_001, "x" * 20_001]
)
strings = st.one_of(ordinary, ordinary, ordinary, hostile)
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([2**63, 2**64 - 1, 2**64, -(2**63) - 1, 1e308, 5e-324]),
)
json_values = st.recursive(
    st.none() | st.booleans() | numbers | strings,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(strings, inner, max_size=3),
    max_leaves=12,
)
known_models = st.sampled_from(["sim", "sim@1", "all-minilm-l6-v2", "all-minilm-l6-v2@1"])
ascii_keys = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=255
)
any_keys = st.text(st.characters(min_codepoint=0, max_codepoint=0xFF), max_size=300)


def sometimes(draw: st.DrawFn, percent: int) -> bool:
    return draw(st.integers(0, 99)) < percent


@st.composite
def requests_(draw: st.DrawFn) -> tuple[dict[str, Any], str | None]:
    """(body, Idempotency-Key): each part hostile about one time in seven."""
    bad = 15  # percent
    model = draw(strings if sometimes(draw, bad) else known_models)
    body: dict[str, Any] = {
        "model": model,
        "input": draw(st.one_of(hostile, json_values) if sometimes(draw, bad) else ordinary),
    }
    if sometimes(draw, 60):
        if sometimes(draw, bad):
            body["params"] = draw(st.dictionaries(strings, json_values, max_size=2) | json_values)
        elif model.startswith("sim"):
            body["params"] = {"salt": draw(ordinary)}
        else:
            body["params"] = {"normalize": draw(st.booleans())}
    if sometimes(draw, 60):
        body["timeout_ms"] = draw(
            st.one_of(numbers, strings) if sometimes(draw, bad) else st.integers(1, 300_000)
        )
    if sometimes(draw, 5):
        body["extra"] = draw(json_values)
    key = None
    if sometimes(draw, 50):
        key = draw(any_keys if sometimes(draw, bad) else ascii_keys)
    return body, key


def wire(body: dict[str, Any], ascii_only: bool) -> bytes:
    """The bytes a hostile client sends: the stdlib writes NaN, lone surrogates as
    escapes (ASCII) or as raw, invalid UTF-8 (not ASCII)."""
    text = json.dumps(body, ensure_ascii=ascii_only, allow_nan=True)
    return text.encode("utf-8", "surrogatepass")


@pytest.fixture(scope="module")
def store(services: Services) -> Iterator[tuple[Engine, str, Tenant]]:
    s = settings_from_env({"DATABASE_URL": services.database_url})
    migrate_database(s)
    engine = make_engine(s.database_url)
    with engine.begin() as conn:
        tenant = create_tenant(conn, f"storable-{uuid.uuid4().hex[:8]}", "free")
    yield engine, s.database_url, tenant
    engine.dispose()


def persist_and_read(
    engine: Engine, database_url: str, tenant: Tenant, raw: bytes, key: str | None
) -> bool:
    """False when the API's validation refuses the body (a 4xx); True once stored and
    answered."""
    try:
        check_headers(SETTINGS, key)
        body = parse_infer(raw, SETTINGS)
        name, _, version = body.model.partition("@")
        if name not in SPECS or (version and version not in SPECS[name]):
            return False  # 404: an unknown model is never produced
        spec = SPECS[name][version or "1"]
        params = accept(spec, body)
    except GristmillError as exc:
        assert 400 <= exc.status < 500 and exc.status != 404, exc
        return False
    now = time.time()
    if key is not None:  # a tenant of its own: examples reuse short keys
        with engine.begin() as conn:
            tenant = create_tenant(conn, f"storable-{uuid.uuid4().hex}", "free")
    rid = str(uuid.uuid4())  # a claim keeps the id it is given (each key is a new tenant's)
    msg = request_message(
        spec,
        body.input,
        params,
        tenant=tenant,
        request_id=rid,
        received=now,
        timeout_ms=body.timeout_ms or 5_000,
        fingerprint=body_hash(body.model, body.input, body.params or {}) if key else "",
    )
    consumed = RequestMessage.decode(msg.encode())  # Kafka carries the bytes
    if key is not None:  # the claim the API writes before producing

        async def claimed() -> None:
            async_engine = create_async_engine(sqlalchemy_url(database_url), poolclass=NullPool)
            try:
                await claim(
                    async_engine,
                    tenant_id=tenant.id,
                    key=key,
                    request_id=rid,
                    body_hash=consumed.body_hash,
                    deadline=consumed.deadline,
                    received=consumed.received_at,
                    model_version=consumed.version,
                )
            finally:
                await async_engine.dispose()

        asyncio.run(claimed())
    bkey = BatchKey(consumed.model, consumed.version, spec.batch_params(consumed.params))
    pending = Pending(consumed, bkey, 0, ("gm.requests.free", 0), 1, now)
    batch = Batch(bkey, [pending], now, "full")
    text = input_text(consumed.input)
    output = sim_output(text, consumed.params.get("salt", "")) if name == "sim" else [0.5] * 4
    rows = succeeded_rows(batch, [output], now, now + 0.001)
    brow = batch_row(
        batch, worker_id="w", status="succeeded", error=None, compute_start=now, compute_end=now
    )
    with engine.begin() as conn:
        write_results(conn, rows, brow)
    with engine.connect() as conn:
        row = conn.execute(
            select(*RESULT_COLUMNS, requests.c.input, requests.c.params).where(
                requests.c.request_id == rid
            )
        ).one()
        if key is not None:
            stored_key = conn.execute(
                select(idempotency_keys.c.key).where(idempotency_keys.c.request_id == rid)
            ).scalar_one()
            assert stored_key == key
    data = dict(row._mapping)
    assert data["input"] == body.input and data["params"] == params
    answer = result_body(data)
    assert answer["output"] == output and answer["request_id"] == rid
    assert answer["model"] == spec.name and answer["model_version"] == spec.version
    return True


def test_any_accepted_body_can_be_persisted_and_answered(
    store: tuple[Engine, str, Tenant],
) -> None:
    engine, url, tenant = store
    outcomes: list[bool] = []

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(request=requests_(), ascii_only=st.booleans())
    def run(request: tuple[dict[str, Any], str | None], ascii_only: bool) -> None:
        body, key = request
        outcomes.append(persist_and_read(engine, url, tenant, wire(body, ascii_only), key))

    run()
    # Not vacuous: a good share of the generated bodies got through and were stored.
    assert sum(outcomes) >= len(outcomes) // 5, (sum(outcomes), len(outcomes))
    print(f"{sum(outcomes)} of {len(outcomes)} generated bodies accepted, stored and answered")


@pytest.mark.parametrize(
    "raw,key",
    [
        (b'{"model": "sim", "input": "caf\\u00e9 \\ud83d\\ude00 \\u0001"}', "k~" * 127),
        (b'{"model": "sim", "input": "x", "params": {"salt": "' + b"s" * 1000 + b'"}}', None),
        (b'{"model": "all-minilm-l6-v2", "input": "' + b"w " * 10_000 + b'"}', None),
        (b'{"model": "sim", "input": "\\u2028\\ufeff\\uffff", "timeout_ms": 300000}', "~ !"),
    ],
)
def test_accepted_edge_values_are_stored_and_answered(
    store: tuple[Engine, str, Tenant], raw: bytes, key: str | None
) -> None:
    engine, url, tenant = store
    assert persist_and_read(engine, url, tenant, raw, key)
