"""ingest/acceptance/genai.py: the OpenTelemetry GenAI conventions' server metrics, their
labels from the registry and a fixed set of error names (decision 59), pure and through
every front door on the in-memory stand-ins."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from core.config import Settings
from core.errors import DeadlineExceeded, InvalidInput, ModelError, RateLimited, Unavailable
from core.models.catalog import build_specs
from core.models.sim import SimSpec
from core.vocab import RequestStatus
from ingest.acceptance.genai import (
    OTHER_ERROR,
    Meter,
    error_type,
    operation_of,
    row_error,
    token_usage,
)
from ingest.acceptance.pipeline import Generation, Order
from ingest.metrics import GENAI_LABELS, REGISTRY
from tests.unit.ingest.acceptance.test_front_doors import DOORS
from tests.unit.ingest.stubs import stub_app

SIM = SimSpec(name="sim", version="1", max_batch_size=8)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def duration_count(op: str, model: str, ref: str, error: str = "") -> float:
    return sample(
        "gen_ai_server_request_duration_seconds_count",
        gen_ai_operation_name=op,
        gen_ai_provider_name="gristmill",
        gen_ai_request_model=model,
        gen_ai_response_model=ref,
        error_type=error,
    )


def test_an_error_is_named_by_its_code_and_anything_else_is_other() -> None:
    assert error_type(RateLimited("slow down")) == "rate_limited"
    assert error_type(DeadlineExceeded("late")) == "deadline_exceeded"
    assert error_type(Unavailable("kafka")) == "unavailable"
    assert error_type(InvalidInput("bad")) == "invalid_input"
    assert error_type(ModelError("boom")) == "model_error"
    assert error_type(RuntimeError("surprise")) == OTHER_ERROR == "_OTHER"
    assert error_type(KeyError("x")) == OTHER_ERROR


def test_a_finished_rows_error_is_what_its_caller_is_answered() -> None:
    assert row_error({"status": RequestStatus.SUCCEEDED}) == ""
    assert row_error({"status": RequestStatus.EXPIRED}) == "deadline_exceeded"
    assert row_error({"status": RequestStatus.FAILED}) == "model_error"


def test_a_generations_tokens_come_from_its_rows_others_from_what_the_api_counted() -> None:
    gen = [{"status": "succeeded", "output": {"prompt_tokens": 5, "completion_tokens": 9}}]
    assert token_usage(4, gen) == (5, 9)
    assert token_usage(7, [{"status": "succeeded", "output": {"label": "x"}}]) == (7, None)
    assert token_usage(None, [{"status": "succeeded", "output": None}]) == (None, None)
    assert token_usage(3, []) == (3, None)


def test_the_operation_follows_the_models_kind() -> None:
    specs = build_specs(Settings())
    lm, emb = specs["gristmill-lm"]["1"], specs["all-minilm-l6-v2"]["1"]
    assert operation_of(Order(SIM, ["a"], {})) == "infer"
    assert operation_of(Order(emb, ["a"], {})) == "embeddings"
    g = Generation(prompt_tokens=2, max_tokens=4)
    assert operation_of(Order(lm, ["a"], {}, generation=g)) == "text_completion"


def test_the_model_label_is_the_registrys_never_what_the_client_typed() -> None:
    order = Order(SIM, ["a"], {}, asked="SIM@1  ")  # however it was asked for
    m = Meter.of(order, (), received=100.0)
    assert m.labels == ("infer", "gristmill", "sim", "sim@1")


def test_a_meter_records_once_its_duration_tokens_and_first_token() -> None:
    lm = build_specs(Settings())["gristmill-lm"]["1"]
    order = Order(lm, ["a"], {}, generation=Generation(prompt_tokens=3, max_tokens=8))
    labels = {
        "gen_ai_operation_name": "text_completion",
        "gen_ai_provider_name": "gristmill",
        "gen_ai_request_model": lm.name,
        "gen_ai_response_model": lm.ref,
    }
    before = {
        "n": duration_count("text_completion", lm.name, lm.ref),
        "in": sample("gen_ai_server_token_usage_sum", **labels, gen_ai_token_type="input"),
        "out": sample("gen_ai_server_token_usage_sum", **labels, gen_ai_token_type="output"),
        "ttft": sample("gen_ai_server_time_to_first_token_seconds_count", **labels),
    }
    m = Meter.of(order, (), received=100.0)
    m.first_token(100.25)
    m.first_token(100.5)  # only the first counts
    row = {"status": "succeeded", "output": {"prompt_tokens": 3, "completion_tokens": 6}}
    m.finished(101.0, [row])
    m.finished(102.0, [row])  # once
    assert duration_count("text_completion", lm.name, lm.ref) == before["n"] + 1
    in_sum = sample("gen_ai_server_token_usage_sum", **labels, gen_ai_token_type="input")
    out_sum = sample("gen_ai_server_token_usage_sum", **labels, gen_ai_token_type="output")
    assert (in_sum - before["in"], out_sum - before["out"]) == (3, 6)
    ttft = sample("gen_ai_server_time_to_first_token_seconds_count", **labels)
    assert ttft == before["ttft"] + 1


def test_a_failure_is_counted_with_its_error_and_no_tokens() -> None:
    sim = dict(zip(GENAI_LABELS, ("infer", "gristmill", "sim", "sim@1"), strict=True))
    before = duration_count("infer", "sim", "sim@1", "rate_limited")
    tokens = sample("gen_ai_server_token_usage_count", **sim, gen_ai_token_type="input")
    Meter(("infer", "gristmill", "sim", "sim@1"), 0.0, 5).finished(1.0, error=RateLimited("x"))
    assert duration_count("infer", "sim", "sim@1", "rate_limited") == before + 1
    assert sample("gen_ai_server_token_usage_count", **sim, gen_ai_token_type="input") == tokens


OPERATIONS = {
    "/v1/infer": "infer",
    "/v1/embeddings": "embeddings",
    "/v2/models/sim/infer": "infer",
    "/v1/completions": "text_completion",
}


@pytest.mark.parametrize(("path", "body", "_inputs"), DOORS, ids=[d[0] for d in DOORS])
def test_every_door_counts_its_answered_request_once_by_the_registrys_model(
    path: str, body: dict[str, Any], _inputs: list[str]
) -> None:
    app, stubs = stub_app(Settings(), tier="paid")
    with TestClient(app) as client:
        headers = {"Authorization": f"Bearer {stubs.key}"}
        r = client.post(path, json=body, headers=headers)
        assert r.status_code == 200, r.text
        spec = stubs.producer.sent[0][1]
        name, ref = spec.model, f"{spec.model}@{spec.version}"
        before = duration_count(OPERATIONS[path], name, ref)
        assert client.post(path, json=body, headers=headers).status_code == 200
        assert duration_count(OPERATIONS[path], name, ref) == before + 1
        # A model the registry does not hold (404) gets no series of its own.
        unknown = {**body, "model": "no-such-model"}
        if path.startswith("/v2/"):
            path = "/v2/models/no-such-model/infer"
        assert client.post(path, json=unknown, headers=headers).status_code == 404
    models = {
        s.labels.get("gen_ai_request_model")
        for metric in REGISTRY.collect()
        if metric.name.startswith("gen_ai_")
        for s in metric.samples
    }
    assert name in models and "no-such-model" not in models


def test_a_streamed_completion_counts_its_first_token_and_its_end() -> None:
    app, stubs = stub_app(Settings(), tier="paid")
    body = {"model": "gristmill-lm", "prompt": "hi", "max_tokens": 4, "stream": True}
    with TestClient(app) as client:
        headers = {"Authorization": f"Bearer {stubs.key}"}
        first = client.post("/v1/completions", json=body, headers=headers)
        assert first.status_code == 200 and "[DONE]" in first.text
        m = stubs.producer.sent[0][1]
        labels = {
            "gen_ai_operation_name": "text_completion",
            "gen_ai_provider_name": "gristmill",
            "gen_ai_request_model": m.model,
            "gen_ai_response_model": f"{m.model}@{m.version}",
        }
        ttft = sample("gen_ai_server_time_to_first_token_seconds_count", **labels)
        n = duration_count("text_completion", m.model, f"{m.model}@{m.version}")
        out = sample("gen_ai_server_token_usage_count", **labels, gen_ai_token_type="output")
        r = client.post("/v1/completions", json=body, headers=headers)
        assert r.status_code == 200 and "[DONE]" in r.text
    assert sample("gen_ai_server_time_to_first_token_seconds_count", **labels) == ttft + 1
    assert duration_count("text_completion", m.model, f"{m.model}@{m.version}") == n + 1
    assert (
        sample("gen_ai_server_token_usage_count", **labels, gen_ai_token_type="output") == out + 1
    )
