"""A model that lives behind HTTP: an existing single-item inference service.

Gristmill queues and batches in front of it; a worker calls it once per item with
bounded concurrency (workers/models/http_backend.py). The spec says where it is and
how to talk to it:

* ``url``: the endpoint a POST goes to;
* ``request_template``: the JSON body, in which the string ``"{{input}}"`` becomes the
  item's input and ``"{{params.NAME}}"`` a request parameter, with their JSON types;
  inside a longer string they are substituted as text;
* ``response_path``: where the output is in the answer, dot-separated keys and list
  indices (``"data.0.embedding"``); empty: the whole answer;
* ``concurrency``: calls in flight at once from one worker;
* ``timeout_ms``: one call's limit.

Rendering and extraction are here, pure and light, so a registration is checked before
any worker sees it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from core.models.spec import ModelSpec, ParamSpec

INPUT = "{{input}}"
_PLACEHOLDER = re.compile(r"\{\{(input|params\.[A-Za-z_][A-Za-z0-9_]*)\}\}")
PARAM_TYPES: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}


class TemplateError(ValueError):
    """A template or response path that cannot work, or an answer without the output."""


def _value(name: str, input_: Any, params: dict[str, Any]) -> Any:
    if name == "input":
        return input_
    key = name.removeprefix("params.")
    if key not in params:
        raise TemplateError(f"the request template uses params.{key}, which the request lacks")
    return params[key]


def render(template: Any, input_: Any, params: dict[str, Any]) -> Any:
    """The request body for one item: ``template`` with its placeholders filled."""
    if isinstance(template, str):
        whole = _PLACEHOLDER.fullmatch(template)
        if whole:
            return _value(whole.group(1), input_, params)
        return _PLACEHOLDER.sub(lambda m: str(_value(m.group(1), input_, params)), template)
    if isinstance(template, dict):
        return {k: render(v, input_, params) for k, v in template.items()}
    if isinstance(template, list):
        return [render(v, input_, params) for v in template]
    return template


def placeholders(template: Any) -> set[str]:
    """Every placeholder name the template uses (``input``, ``params.x``)."""
    if isinstance(template, str):
        return {m.group(1) for m in _PLACEHOLDER.finditer(template)}
    if isinstance(template, dict):
        return set().union(*(placeholders(v) for v in template.values()))
    if isinstance(template, list):
        return set().union(*(placeholders(v) for v in template))
    return set()


def parse_path(path: str) -> tuple[str | int, ...]:
    if not path:
        return ()
    parts: list[str | int] = []
    for part in path.split("."):
        if not part:
            raise TemplateError(f"response path {path!r} has an empty part")
        parts.append(int(part) if part.isdigit() else part)
    return tuple(parts)


def extract(answer: Any, path: tuple[str | int, ...]) -> Any:
    """The output at ``path`` in a parsed answer; ``TemplateError`` naming the missing part."""
    cur = answer
    for i, part in enumerate(path):
        where = ".".join(map(str, path[: i + 1]))
        if isinstance(part, int) and isinstance(cur, list):
            if part >= len(cur):
                raise TemplateError(f"the answer has no {where} (list of {len(cur)})")
            cur = cur[part]
        elif isinstance(cur, dict) and str(part) in cur:
            cur = cur[str(part)]
        else:
            raise TemplateError(f"the answer has no {where}")
    return cur


def params_from_config(raw: Any) -> tuple[ParamSpec, ...]:
    """``[{"name": "lang", "type": "str", "default": "en", "batching": true}, ...]``."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise TemplateError("params must be a list of {name, type, default}")
    out = []
    for p in raw:
        if not isinstance(p, dict) or not isinstance(p.get("name"), str):
            raise TemplateError("each parameter needs a name")
        kind = PARAM_TYPES.get(str(p.get("type", "str")))
        if kind is None:
            raise TemplateError(f"parameter {p['name']}: type must be one of {list(PARAM_TYPES)}")
        default = p.get("default", kind())
        if not isinstance(default, kind) or (kind is not bool and isinstance(default, bool)):
            raise TemplateError(f"parameter {p['name']}: default must be {kind.__name__}")
        out.append(ParamSpec(p["name"], kind, default, bool(p.get("batching", True))))
    return tuple(out)


@dataclass
class HttpSpec(ModelSpec):
    url: str = ""
    request_template: Any = field(default_factory=lambda: {"input": INPUT})
    response_path: str = ""
    concurrency: int = 8  # calls in flight at once from one worker
    timeout_ms: int = 10_000  # one call
    # What the worker sends to learn whether a down service is back (half-open probe).
    probe_input: str = "ping"

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise TemplateError(f"url must be http:// or https://, not {self.url!r}")
        if "input" not in placeholders(self.request_template):
            raise TemplateError(f"the request template must use {INPUT}")
        declared = {p.name for p in self.params}
        for name in placeholders(self.request_template) - {"input"}:
            if name.removeprefix("params.") not in declared:
                raise TemplateError(f"the request template uses {name}, which is not declared")
        parse_path(self.response_path)
        if self.concurrency < 1:
            raise TemplateError("concurrency must be at least 1")
        if self.timeout_ms < 1:
            raise TemplateError("timeout_ms must be at least 1")
