"""ingest/edge/tracing.py and the pipeline's GenAI attributes (decision 55): which
requests get a span and by what name, and what the GenAI conventions' attributes say."""

from __future__ import annotations

import time
import uuid

import pytest

from core.config import Settings
from core.models.catalog import build_specs
from core.models.sim import SimSpec
from core.models.token_ids import tokenized_input
from ingest.acceptance.genai import span_attributes as _genai
from ingest.acceptance.message import request_message
from ingest.acceptance.pipeline import Generation, Order
from ingest.edge.tracing import genai_attributes, span_name
from results.tenants import Tenant

TENANT = Tenant(id=str(uuid.uuid4()), name="t", tier="paid")


@pytest.mark.parametrize(
    ("method", "path", "name"),
    [
        ("POST", "/v1/infer", "POST /v1/infer"),
        ("POST", "/v1/embeddings", "POST /v1/embeddings"),
        ("POST", "/v1/completions", "POST /v1/completions"),
        ("POST", "/v1/jobs", "POST /v1/jobs"),
        ("POST", "/v1/batches", "POST /v1/batches"),
        ("POST", "/v2/models/sim/infer", "POST /v2/models/{model}/infer"),
        (
            "POST",
            "/v2/models/sim/versions/1/infer",
            "POST /v2/models/{model}/versions/{version}/infer",
        ),
        ("GET", "/v1/infer", None),
        ("POST", "/v1/files", None),
        ("GET", "/v2/models/sim", None),
        ("POST", "/v2/models/sim/other/1/infer", None),
        ("POST", "/v2/models/a/b/c/d/infer", None),
        ("POST", "/v1/infer/", None),
    ],
)
def test_a_span_for_each_request_a_model_serves_named_by_its_template(
    method: str, path: str, name: str | None
) -> None:
    assert span_name(method, path) == name


def test_the_attributes_name_the_operation_models_and_known_tokens() -> None:
    a = genai_attributes(operation="embeddings", requested="m", served="m@2", input_tokens=7)
    assert a == {
        "gen_ai.operation.name": "embeddings",
        "gen_ai.provider.name": "gristmill",
        "gen_ai.request.model": "m",
        "gen_ai.response.model": "m@2",
        "gen_ai.usage.input_tokens": 7,
    }
    g = genai_attributes(
        operation="text_completion", requested="lm", served="lm@1", max_tokens=32, temperature=0
    )
    assert g["gen_ai.request.max_tokens"] == 32 and g["gen_ai.request.temperature"] == 0.0
    assert "gen_ai.usage.input_tokens" not in g


def _msgs(order: Order) -> list:  # type: ignore[type-arg]
    return [
        request_message(
            order.spec,
            v,
            order.params,
            tenant=TENANT,
            request_id=str(uuid.uuid4()),
            received=time.time(),
            timeout_ms=1000,
        )
        for v in order.inputs
    ]


def test_a_generation_counts_its_prompt_and_names_its_sampling() -> None:
    lm = build_specs(Settings())["gristmill-lm"]["1"]
    order = Order(
        lm,
        [tokenized_input("hi", [1, 2, 3])],
        {"temperature": 0.5},
        generation=Generation(prompt_tokens=3, max_tokens=16),
        asked="gristmill-lm",
    )
    a = _genai(order, [])
    assert a["gen_ai.operation.name"] == "text_completion"
    assert a["gen_ai.usage.input_tokens"] == 3 and a["gen_ai.request.max_tokens"] == 16
    assert a["gen_ai.request.temperature"] == 0.5 and a["gen_ai.response.model"] == lm.ref


def test_another_model_is_infer_with_no_token_count() -> None:
    spec = SimSpec(name="sim", version="1", max_batch_size=8)
    order = Order(spec, ["a", "b"], {})
    a = _genai(order, _msgs(order))
    assert a["gen_ai.operation.name"] == "infer" and a["gen_ai.request.model"] == "sim"
    assert a["gen_ai.response.model"] == "sim@1" and "gen_ai.usage.input_tokens" not in a


def test_embeddings_count_the_ids_the_api_made() -> None:
    emb = build_specs(Settings())["all-minilm-l6-v2"]["1"]
    order = Order(emb, ["hello world", "kafka"], {}, many=True, asked="all-minilm-l6-v2")
    msgs = _msgs(order)
    a = _genai(order, msgs)
    assert a["gen_ai.operation.name"] == "embeddings"
    if all(isinstance(m.input, dict) for m in msgs):  # the tokenizer is here
        assert a["gen_ai.usage.input_tokens"] == sum(len(m.input["ids"]) for m in msgs)
    else:  # no tokenizer files: the worker counts, and the span says nothing
        assert "gen_ai.usage.input_tokens" not in a
