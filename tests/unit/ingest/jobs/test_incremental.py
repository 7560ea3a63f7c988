"""Incremental jobs' pure parts (decision 61): what an item's content hash covers, how
staging writes it, which staged items a publish skips, and when a job may be a base."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from core.errors import InvalidInput
from core.models.sim import SimSpec
from ingest.jobs.incremental import (
    canonical_input,
    check_base,
    hasher_for,
    item_hash,
    scope_digest,
)
from ingest.jobs.upload import ItemStager

SPEC = SimSpec(name="sim", version="1", max_batch_size=100)
TENANT = "00000000-0000-0000-0000-0000000000aa"
JOB = "00000000-0000-0000-0000-000000000001"


def h(
    value: Any,
    *,
    tenant: str = TENANT,
    model: str = "sim",
    version: str = "1",
    params: dict[str, Any] | None = None,
) -> bytes:
    scope = scope_digest(tenant, model, version, params or {})
    return item_hash(scope, canonical_input(value, orjson.dumps(value).decode()))


def test_the_hash_is_stable_across_runs_and_releases() -> None:
    """Pinned: a change here makes every stored job's items unmatchable (no wrong
    reuse, but no reuse either); a new scheme must come with a new _SCHEME."""
    # sha256(sha256(b"gristmill-item-v1\0" + scope JSON) + input JSON), worked out by hand.
    assert h("hello").hex() == ("1abf82cea75578e31b83525350b33e86f89bea8edd84dbf6e2c94c5dc4053312")
    assert h("hello") == h("hello")


@pytest.mark.parametrize(
    "change",
    [
        {"value": "hello!"},  # the input
        {"tenant": "00000000-0000-0000-0000-0000000000bb"},  # the tenant
        {"model": "sim2"},
        {"version": "2"},
        {"params": {"dim": 3}},  # a parameter that changes the output
    ],
)
def test_everything_that_decides_the_output_changes_the_hash(change: dict[str, Any]) -> None:
    base: dict[str, Any] = {"value": "hello"}
    assert h(**{**base, **change}) != h(**base)


def test_equal_inputs_and_params_hash_equal_whatever_their_key_order() -> None:
    assert h({"a": 1, "b": [1, {"x": 2, "y": 3}]}) == h({"b": [1, {"y": 3, "x": 2}], "a": 1})
    assert h("x", params={"p": 1, "q": 2}) == h("x", params={"q": 2, "p": 1})
    # Field boundaries are not ambiguous: the scope is JSON, the input follows a digest.
    assert h("x", model="ab", version="c") != h("x", model="a", version="bc")
    assert h("1") != h(1)  # a string and a number are different inputs


def stager() -> ItemStager:
    return ItemStager(
        JOB,
        SPEC,
        max_items=100,
        max_line=1 << 20,
        max_depth=32,
        folder="",
        scope=scope_digest(TENANT, "sim", "1", {}),
    )


def staged_rows(s: ItemStager) -> list[list[str]]:
    staged = s.finish()
    staged.file.seek(0)
    return [r.split("\t") for r in staged.file.read().decode().splitlines()]


def test_staging_writes_each_items_hash_as_copy_bytea_and_ignores_the_custom_id() -> None:
    s = stager()
    s.feed(b'{"input": "a", "custom_id": "one"}\n{"input": "a", "custom_id": "two"}\n')
    s.feed(b'{"input": "b\\tc"}\n')
    rows = staged_rows(s)
    assert [len(r) for r in rows] == [6, 6, 6]
    # COPY text format: "\\x" is the bytea hex prefix with its backslash escaped.
    assert rows[0][5] == "\\\\x" + h("a").hex()
    assert rows[0][5] == rows[1][5]  # same input, different custom ids: one hash
    assert rows[2][5] == "\\\\x" + h("b\tc").hex()


def test_a_publish_of_the_staged_file_skips_the_reused_items() -> None:
    s = stager()
    s.feed(b"".join(orjson.dumps({"input": f"t{i}"}) + b"\n" for i in range(10)))
    staged = s.finish()
    staged.reused = frozenset({0, 3, 4, 9})
    sent = [i for page in staged.pages(64) for i, _, _, _ in page]
    assert sent == [1, 2, 5, 6, 7, 8]
    # Items matched at recording whose base row was gone by the copy are sent after it.
    left = [i for page in staged.pages(64, only=frozenset({3, 9})) for i, _, _, _ in page]
    assert left == [3, 9]


def job(**kw: Any) -> SimpleNamespace:
    fields: dict[str, Any] = {
        "job_id": JOB,
        "model": "sim",
        "model_version": "1",
        "finished_at": datetime(2026, 1, 1, tzinfo=UTC),
        "output_expired_at": None,
    }
    return SimpleNamespace(**{**fields, **kw})


def test_a_finished_job_of_the_same_model_version_may_be_a_base() -> None:
    assert check_base(job(), "sim", "1") is None  # no 400 raised


@pytest.mark.parametrize(
    ("row", "words"),
    [
        (job(model_version="2"), ["sim@2", "sim@1"]),  # names both
        (job(model="other"), ["other@1", "sim@1"]),
        (job(finished_at=None), ["not finished"]),
        (job(output_expired_at=datetime(2026, 2, 1, tzinfo=UTC)), ["expired"]),
    ],
)
def test_a_base_that_cannot_lend_its_results_is_a_400_naming_why(
    row: SimpleNamespace, words: list[str]
) -> None:
    with pytest.raises(InvalidInput) as e:
        check_base(row, "sim", "1", "base_batch_id")
    assert e.value.field == "base_batch_id"
    assert all(w in e.value.message for w in words), e.value.message


def test_a_re_embeds_items_hash_as_staging_would_for_the_new_version() -> None:
    # A migration job's items (results/reembed.py) come from PostgreSQL, not an upload:
    # their hash must be the one staging writes, so the next incremental refresh of the
    # corpus can name the migration job as its base.
    s = stager()
    s.feed(b'{"input": "a"}\n{"input": "\\u00e9 \\"q\\""}\n')
    rows = staged_rows(s)
    for_job = hasher_for("sim", "1")(TENANT, {})
    assert rows[0][5] == "\\\\x" + for_job("a").hex()
    assert rows[1][5] == "\\\\x" + for_job('\u00e9 "q"').hex()
    assert hasher_for("sim", "2")(TENANT, {})("a") != for_job("a")  # per version
    assert for_job({"b": 1, "a": [2]}) == h({"a": [2], "b": 1})
