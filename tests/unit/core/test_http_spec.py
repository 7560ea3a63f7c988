"""The HTTP backend's request template and response path (core/models/http.py)."""

from __future__ import annotations

import pytest

from core.models.http import (
    HttpSpec,
    TemplateError,
    extract,
    params_from_config,
    parse_path,
    placeholders,
    render,
)


def test_a_whole_placeholder_keeps_the_values_json_type() -> None:
    t = {"inputs": ["{{input}}"], "opts": {"k": "{{params.k}}"}, "fixed": 3}
    assert render(t, "hi", {"k": 7}) == {"inputs": ["hi"], "opts": {"k": 7}, "fixed": 3}
    assert render("{{input}}", {"a": 1}, {}) == {"a": 1}


def test_a_placeholder_inside_text_is_substituted_as_text() -> None:
    assert render({"prompt": "say: {{input}}!"}, "hi", {}) == {"prompt": "say: hi!"}


def test_a_missing_parameter_names_it() -> None:
    with pytest.raises(TemplateError, match=r"params\.lang"):
        render({"l": "{{params.lang}}"}, "x", {})


def test_placeholders_are_found_anywhere() -> None:
    assert placeholders({"a": ["{{input}}", {"b": "x {{params.y}}"}]}) == {"input", "params.y"}


def test_response_paths_take_keys_and_list_indices() -> None:
    answer = {"data": [{"embedding": [0.1, 0.2]}], "label": "x"}
    assert extract(answer, parse_path("data.0.embedding")) == [0.1, 0.2]
    assert extract(answer, parse_path("")) == answer
    with pytest.raises(TemplateError, match=r"data\.1"):
        extract(answer, parse_path("data.1"))
    with pytest.raises(TemplateError, match="nope"):
        extract(answer, parse_path("nope"))
    with pytest.raises(TemplateError, match="empty part"):
        parse_path("a..b")


def test_declared_params_validate_and_type_check() -> None:
    ps = params_from_config([{"name": "lang", "type": "str", "default": "en"}])
    assert ps[0].name == "lang" and ps[0].default == "en" and ps[0].batching
    with pytest.raises(TemplateError, match="type"):
        params_from_config([{"name": "x", "type": "complex"}])
    with pytest.raises(TemplateError, match="default"):
        params_from_config([{"name": "x", "type": "int", "default": True}])


def test_a_spec_refuses_what_cannot_work() -> None:
    ok = HttpSpec("h", "1", 8, url="http://x/p", request_template={"t": "{{input}}"})
    assert ok.concurrency == 8
    with pytest.raises(TemplateError):
        HttpSpec("h", "1", 8, url="http://x/p", concurrency=0)
    with pytest.raises(TemplateError):
        HttpSpec("h", "1", 8, url="x/p")
