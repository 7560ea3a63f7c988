"""An input file's lines staged as job items, with the served models' own checks
(no services: the staged COPY rows are read back)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.config import Settings
from core.errors import GristmillError, InvalidInput, PayloadTooLarge
from core.models.catalog import build_specs, latest
from core.models.spec import ModelSpec
from ingest.jobs.upload import ItemStager
from ingest.openai.batches import BatchStager

JOB = "0b7c5d3e-8a6f-4c1e-9d2a-5f4e3b2a1c0d"
SPECS = build_specs(Settings())
LM = latest(SPECS["gristmill-lm"])


def gen(i: int, prompt: str, **body: Any) -> str:
    return json.dumps(
        {
            "custom_id": f"g{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "gristmill-lm", "prompt": prompt, "max_tokens": 5, **body},
        }
    )


def stage(spec: ModelSpec, endpoint: str, raw: bytes, chunk: int = 7) -> list[list[str]]:
    """The staged rows; fed in small chunks so lines span them."""
    bs = BatchStager(endpoint, 1 << 20)
    bs.spec = spec
    bs.items = ItemStager(
        JOB, spec, max_items=5, max_line=1 << 20, max_depth=32, folder="", scope=b"s" * 32
    )
    try:
        for i in range(0, len(raw), chunk):
            bs.stage(bs.lines(raw[i : i + chunk]))
        bs.stage(bs.last())
        staged = bs.items.finish()
        staged.file.seek(0)
        return [r.split("\t") for r in staged.file.read().decode().splitlines()]
    finally:
        bs.items.close()


def refused(raw: bytes) -> GristmillError:
    with pytest.raises(GristmillError) as exc:
        stage(LM, "/v1/completions", raw)
    return exc.value


def test_lines_become_items_in_order_with_their_custom_ids() -> None:
    raw = "\n".join(gen(i, f"hello {i}") for i in range(3)).encode()  # no final newline
    rows = stage(LM, "/v1/completions", raw)
    assert [(r[1], r[2], r[3]) for r in rows] == [
        ("0", "g0", '"hello 0"'),
        ("1", "g1", '"hello 1"'),
        ("2", "g2", '"hello 2"'),
    ]


def test_blank_lines_are_skipped_but_counted() -> None:
    raw = (gen(0, "a") + "\n\n" + gen(1, "b", temperature=0.5) + "\n").encode()
    exc = refused(raw)
    assert isinstance(exc, InvalidInput) and exc.field == "line 3.body"


def test_a_completion_that_cannot_fit_is_refused_naming_its_line() -> None:
    exc = refused(gen(0, "a", max_tokens=100_000).encode())
    assert exc.field == "line 1.body.max_tokens" and "context" in exc.message
    exc = refused(gen(0, "a", max_tokens=0).encode())
    assert exc.field == "line 1.body.max_tokens"


def test_more_lines_than_the_item_limit_is_413() -> None:
    exc = refused("\n".join(gen(i, "x") for i in range(6)).encode())
    assert isinstance(exc, PayloadTooLarge)


def test_a_line_that_is_not_utf8_json_names_its_line() -> None:
    exc = refused(gen(0, "a").encode() + b"\n\xff\xfe\n")
    assert exc.field == "line 2"
