"""ingest/edge/error_shapes.py: each route's clients read errors in their own shape."""

from __future__ import annotations

import orjson

from core.errors import InvalidInput, RateLimited, Unauthorized, Unavailable
from ingest.edge.error_shapes import Shape, body, error_body, openai_type, shape_for
from ingest.edge.http import error_response, internal_error


def test_the_path_picks_the_shape() -> None:
    assert shape_for("/v1/embeddings") is Shape.OPENAI
    assert shape_for("/v2") is Shape.KSERVE
    assert shape_for("/v2/models/x/infer") is Shape.KSERVE
    assert shape_for("/v2x") is Shape.GRISTMILL
    assert shape_for("/v1/infer") is Shape.GRISTMILL


def test_openai_shape() -> None:
    err = InvalidInput("input must not be empty", field="input[2]")
    assert error_body(err, Shape.OPENAI) == {
        "error": {
            "message": "input must not be empty",
            "type": "invalid_request_error",
            "param": "input[2]",
            "code": "invalid_input",
        }
    }
    assert openai_type(Unauthorized("x").status) == "authentication_error"
    assert openai_type(RateLimited("x").status) == "rate_limit_error"
    assert openai_type(599) == "server_error"


def test_kserve_shape_is_a_message() -> None:
    assert error_body(Unavailable("busy"), Shape.KSERVE) == {"error": "busy"}


def test_gristmill_shape_unchanged() -> None:
    err = InvalidInput("bad", field="input")
    assert error_body(err, Shape.GRISTMILL) == err.to_body()


def test_status_and_retry_after_are_the_same_in_every_shape() -> None:
    for shape in Shape:
        r = error_response(Unavailable("busy", retry_after_s=2.5), shape)
        assert r.status_code == 503 and r.headers["Retry-After"] == "3"


def test_a_bug_is_500_with_a_reference_in_openais_shape() -> None:
    r = internal_error(RuntimeError("secret detail"), "test", Shape.OPENAI)
    b = orjson.loads(r.body)
    assert r.status_code == 500
    assert b["error"]["type"] == "server_error" and b["error"]["code"] == "internal_error"
    assert "secret" not in b["error"]["message"] and "reference" in b["error"]["message"]
    assert body(Shape.GRISTMILL, 500, "c", "m", reference="r")["error"]["reference"] == "r"  # type: ignore[index]


def test_completions_and_their_ids_are_openai_shaped() -> None:
    assert shape_for("/v1/completions") is Shape.OPENAI
    assert shape_for("/v1/completions/cmpl-0f6f1a9e") is Shape.OPENAI
    # A template's {name} is exactly one non-empty segment.
    assert shape_for("/v1/completions/") is Shape.GRISTMILL
    assert shape_for("/v1/completions/a/b") is Shape.GRISTMILL
    assert shape_for("/v1/completionsx") is Shape.GRISTMILL
    assert shape_for("/v1/requests/cmpl-0f6f1a9e") is Shape.GRISTMILL
