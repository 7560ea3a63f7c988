"""The clients teams already have, unmodified, against Gristmill over real HTTP, Kafka
and PostgreSQL: the official ``openai`` SDK (embeddings, models) and ``tritonclient``
(KServe v2). Only the base URL and the key change."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as triton
from sqlalchemy import Text, cast, func, literal, select
from tritonclient.utils import InferenceServerException

from gristmill.devservices.stack import System
from ingest.acceptance.pipeline import item_request_id
from results.db import make_engine
from results.schema import idempotency_keys, requests

MODEL = "all-minilm-l6-v2"
DIM = 384


@pytest.fixture(scope="module")
def tclient(served: System) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(served.url.removeprefix("http://"), network_timeout=60)
    yield c
    c.close()


def native(system: System, text: str) -> list[float]:
    r = httpx.post(
        f"{system.url}/v1/infer",
        json={"model": MODEL, "input": text},
        headers=system.headers(),
        timeout=30,
    )
    assert r.status_code == 200, r.text
    out: list[float] = r.json()["output"]
    return out


# --- OpenAI ---------------------------------------------------------------------------


def test_sdk_default_base64_and_float_agree_with_the_native_api(
    served: System, client: openai.OpenAI
) -> None:
    text = "the quick brown fox"
    b64 = client.embeddings.create(model=MODEL, input=text)  # the SDK asks for base64
    flt = client.embeddings.create(model=MODEL, input=text, encoding_format="float")
    for r in (b64, flt):
        assert r.object == "list" and len(r.data) == 1
        assert r.data[0].index == 0 and len(r.data[0].embedding) == DIM
        assert r.model.startswith(MODEL)
        assert r.usage.prompt_tokens == r.usage.total_tokens == 6  # [CLS] 4 words [SEP]
    # Both carry the float32 row the model made, bit for bit, as /v1/infer does.
    assert b64.data[0].embedding == flt.data[0].embedding
    assert flt.data[0].embedding == pytest.approx(native(served, text), abs=1e-6)
    assert math.sqrt(sum(x * x for x in flt.data[0].embedding)) == pytest.approx(1.0, abs=1e-4)


def test_many_inputs_answer_in_input_order(served: System, client: openai.OpenAI) -> None:
    texts = ["a red apple", "a tall mountain", "a fast car"]
    r = client.embeddings.create(model=MODEL, input=texts)
    assert [d.index for d in r.data] == [0, 1, 2]
    for d, t in zip(r.data, texts, strict=True):
        assert d.embedding == pytest.approx(native(served, t), abs=1e-4)


def test_2048_inputs_are_batched_not_serialised(served: System, client: openai.OpenAI) -> None:
    texts = [f"sentence number {i}" for i in range(2048)]
    key = uuid.uuid4().hex
    started = time.monotonic()
    # The default deadline (paid: 2 s per batch of 256, 16 s) assumes the workers' share
    # of a quiet machine; on the shared 2-core test box the CPU model may need longer.
    r = client.embeddings.create(
        model=MODEL,
        input=texts,
        extra_headers={"Idempotency-Key": key},
        extra_body={"timeout_ms": 120_000},
    )
    took = time.monotonic() - started
    assert len(r.data) == 2048 and [d.index for d in r.data] == list(range(2048))
    assert r.data[7].embedding == pytest.approx(native(served, texts[7]), abs=1e-4)
    with make_engine(served.settings.database_url).connect() as conn:
        first = conn.execute(
            select(idempotency_keys.c.request_id).where(
                idempotency_keys.c.tenant_id == served.tenant_ids["paid"],
                idempotency_keys.c.key == key,
            )
        ).scalar_one()
        ids = [item_request_id(str(first), i) for i in range(2048)]
        n, batches = conn.execute(
            select(func.count(), func.count(requests.c.batch_id.distinct())).where(
                requests.c.request_id.in_(ids)
            )
        ).one()
    assert n == 2048  # one row per input
    # Serialised would be a batch per input; the batch size itself is the cost curve's
    # choice for this machine (64 on a 2-core CPU), so only "together" is asserted.
    assert batches <= 2048 // 16, f"{batches} batches: inputs were not batched together"
    # The same key and body is a retry: the same rows, answered again, nothing re-run.
    again = client.embeddings.create(
        model=MODEL,
        input=texts,
        encoding_format="float",
        extra_headers={"Idempotency-Key": key},
        extra_body={"timeout_ms": 120_000},
    )
    assert again.data[2047].embedding == pytest.approx(r.data[2047].embedding, abs=1e-6)
    print(f"2048 inputs answered in {took:.1f} s")


def test_dimensions_shorten_and_renormalise(client: openai.OpenAI) -> None:
    full = client.embeddings.create(model=MODEL, input="hello", encoding_format="float")
    short = client.embeddings.create(model=MODEL, input="hello", dimensions=32)
    v = np.asarray(short.data[0].embedding)
    assert v.shape == (32,) and np.linalg.norm(v) == pytest.approx(1.0, abs=1e-5)
    head = np.asarray(full.data[0].embedding[:32])
    assert v == pytest.approx(head / np.linalg.norm(head), abs=1e-5)
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=MODEL, input="hello", dimensions=DIM + 1)
    assert e.value.param == "dimensions"


def test_token_ids_are_refused_saying_how_to_send_text(client: openai.OpenAI) -> None:
    for ids in ([101, 7592, 102], [[101, 7592, 102]]):
        with pytest.raises(openai.BadRequestError) as e:
            client.embeddings.create(model=MODEL, input=ids)
        assert e.value.param == "input" and e.value.type == "invalid_request_error"
        assert "send the text as a string or an array of strings" in e.value.message


def test_an_impossible_timeout_is_a_400_naming_timeout_ms_and_the_minimum(
    served: System, client: openai.OpenAI
) -> None:
    """A deadline shorter than the model's batch of one plus the scheduler's margin can
    never be met: the SDK's BadRequestError, naming the field (decision 62)."""
    with pytest.raises(openai.BadRequestError) as bad:
        client.embeddings.create(model=MODEL, input="x", extra_body={"timeout_ms": 1})
    assert bad.value.param == "timeout_ms"
    assert "timeout_ms" in bad.value.message and "minimum of" in bad.value.message


def test_errors_in_openais_shape_with_gristmills_status(
    served: System, client: openai.OpenAI
) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        client.embeddings.create(model="text-embedding-3-small", input="x")
    assert nf.value.param == "model" and MODEL in nf.value.message
    with pytest.raises(openai.BadRequestError) as bad:  # sim answers digests, not vectors
        client.embeddings.create(model="sim", input="x")
    assert bad.value.param == "model"
    with pytest.raises(openai.BadRequestError) as empty:
        client.embeddings.create(model=MODEL, input=["ok", "  "])
    assert empty.value.param == "input[1]"
    stranger = openai.OpenAI(base_url=f"{served.url}/v1", api_key="gm_nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as auth:
        stranger.embeddings.create(model=MODEL, input="x")
    body = auth.value.body
    assert isinstance(body, dict) and body["type"] == "authentication_error"
    key = uuid.uuid4().hex
    client.embeddings.create(model=MODEL, input="one", extra_headers={"Idempotency-Key": key})
    with pytest.raises(openai.UnprocessableEntityError):
        client.embeddings.create(model=MODEL, input="two", extra_headers={"Idempotency-Key": key})


def test_prefer_respond_async_answers_202_with_a_location(served: System) -> None:
    r = httpx.post(
        f"{served.url}/v1/embeddings",
        json={"model": MODEL, "input": ["async one", "async two"]},
        headers={**served.headers(), "Prefer": "respond-async"},
        timeout=30,
    )
    assert r.status_code == 202, r.text
    assert r.headers["Preference-Applied"] == "respond-async"
    body = r.json()
    assert r.headers["Location"] == body["data"][0]["url"]
    assert [d["index"] for d in body["data"]] == [0, 1]
    deadline = time.time() + 30
    while time.time() < deadline:
        got = httpx.get(f"{served.url}{r.headers['Location']}", headers=served.headers())
        if got.status_code == 200:
            assert got.json()["status"] == "succeeded" and len(got.json()["output"]) == DIM
            break
        time.sleep(0.2)
    else:
        pytest.fail("the accepted request never finished")
    # With wait=N and a fast answer, the client gets the embeddings themselves.
    r = httpx.post(
        f"{served.url}/v1/embeddings",
        json={"model": MODEL, "input": "quick"},
        headers={**served.headers(), "Prefer": "respond-async, wait=20"},
        timeout=30,
    )
    assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == DIM


def test_models_in_both_shapes(served: System, client: openai.OpenAI) -> None:
    ids = {m.id for m in client.models.list()}
    assert {MODEL, f"{MODEL}@1", "sim", "sim@1"} <= ids
    native_body = httpx.get(f"{served.url}/v1/models").json()
    assert {m["model"] for m in native_body["models"]} >= {MODEL, "sim"}


# --- KServe v2 / Triton -----------------------------------------------------------------


def text_input(texts: list[str], binary: bool) -> triton.InferInput:
    t = triton.InferInput("text", [len(texts)], "BYTES")
    t.set_data_from_numpy(np.array([s.encode() for s in texts], dtype=np.object_), binary)
    return t


def test_triton_health_and_metadata(tclient: triton.InferenceServerClient) -> None:
    assert tclient.is_server_live() and tclient.is_server_ready()
    assert "binary_tensor_data" in tclient.get_server_metadata()["extensions"]
    assert tclient.is_model_ready(MODEL) and tclient.is_model_ready(MODEL, "1")
    assert not tclient.is_model_ready("no-such-model")
    meta = tclient.get_model_metadata(MODEL)
    assert meta["inputs"][0] == {"name": "text", "datatype": "BYTES", "shape": [-1]}
    assert meta["outputs"][0] == {"name": "embedding", "datatype": "FP32", "shape": [-1, DIM]}
    assert tclient.get_model_metadata(MODEL, "1")["versions"] == ["1"]


@pytest.mark.parametrize("binary", [True, False])
def test_triton_infer_binary_and_json(
    served: System, tclient: triton.InferenceServerClient, binary: bool
) -> None:
    texts = ["the first text", "the second one"]
    out = triton.InferRequestedOutput("embedding", binary_data=binary)
    r = tclient.infer(MODEL, [text_input(texts, binary)], outputs=[out], headers=served.headers())
    emb = r.as_numpy("embedding")
    assert emb.dtype == np.float32 and emb.shape == (2, DIM)
    for row, t in zip(emb, texts, strict=True):
        assert row.tolist() == pytest.approx(native(served, t), abs=1e-4)
    # No outputs named: tritonclient asks for every output in binary.
    r = tclient.infer(MODEL, [text_input(texts, True)], headers=served.headers(), model_version="1")
    assert r.as_numpy("embedding").shape == (2, DIM)


def test_triton_priority_and_timeout_map_to_tier_and_deadline(
    served: System, tclient: triton.InferenceServerClient
) -> None:
    text = f"lowered {uuid.uuid4().hex}"
    r = tclient.infer(
        MODEL,
        [text_input([text], True)],
        headers=served.headers("enterprise"),
        priority=3,  # the third tier from the top: free
        timeout=30_000_000,  # microseconds
    )
    assert r.as_numpy("embedding").shape == (1, DIM)
    with make_engine(served.settings.database_url).connect() as conn:
        row = conn.execute(
            select(requests.c.priority, requests.c.deadline_at, requests.c.received_at).where(
                requests.c.input == func.to_jsonb(cast(literal(text), Text))
            )
        ).one()
    assert row.priority == "free"
    assert (row.deadline_at - row.received_at).total_seconds() == pytest.approx(30, abs=0.01)


def test_triton_errors(served: System, tclient: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as e:
        tclient.infer("no-such-model", [text_input(["x"], True)], headers=served.headers())
    assert e.value.status() == "404" and "unknown model" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        tclient.infer(MODEL, [text_input(["x"], True)], headers={"Authorization": "Bearer no"})
    assert e.value.status() == "401"
    wrong = triton.InferInput("INPUT0", [1], "BYTES")
    wrong.set_data_from_numpy(np.array([b"x"], dtype=np.object_))
    with pytest.raises(InferenceServerException) as e:
        tclient.infer(MODEL, [wrong], headers=served.headers())
    assert e.value.status() == "400" and "'text'" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        tclient.infer(MODEL, [text_input([""], True)], headers=served.headers())
    assert e.value.status() == "400"


def test_http_level_errors_keep_openais_shape(served: System) -> None:
    url = f"{served.url}/v1/embeddings"
    r = httpx.get(url, headers=served.headers())
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(url, json={"model": MODEL, "input": "x" * 2_000_000}, headers=served.headers())
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    r = httpx.post(url, content=b"{", headers=served.headers())
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = httpx.post(url, json={"model": MODEL, "input": "x"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
