"""schemathesis against the live OpenAPI schema: whatever it generates, no 5xx and no
answer that breaks the schema (statuses, content types, bodies), and no route that
answers without the key. A short run here; `make fuzz` runs a long one
(GRISTMILL_FUZZ_EXAMPLES per operation)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    response_schema_conformance,
    status_code_conformance,
)

from gristmill.devservices.stack import System

EXAMPLES = int(os.environ.get("GRISTMILL_FUZZ_EXAMPLES", "25"))


@pytest.fixture(scope="module")
def api_schema(system: System) -> Any:
    return schemathesis.openapi.from_url(f"{system.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


def tight_deadline(case: Any) -> bool:
    """A 504 is the promised answer when the caller's own timeout_ms is shorter than a
    batch can run (the sim model's batch takes 100 ms)."""
    body = case.body if isinstance(case.body, dict) else {}
    timeout = body.get("timeout_ms")
    return isinstance(timeout, int) and timeout < 2_000


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_api_holds_to_its_schema_under_fuzzing(case: Any, system: System) -> None:
    headers = system.headers("enterprise")
    response = case.call(headers=headers, timeout=60)
    assert response.status_code < 500 or (response.status_code == 504 and tight_deadline(case)), (
        f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:500]}"
    )
    case.validate_response(
        response,
        checks=[
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
            ignored_auth,
        ],
        headers=headers,
    )
