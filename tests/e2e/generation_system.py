"""A system that serves the generation model, started and warmed up: the fixtures of
the completions tests share it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from gristmill.devservices.stack import Services, System, build_system

MODEL = "gristmill-lm"


@contextmanager
def generation_system(
    services: Services, workdir: Path, extra_env: dict[str, str] | None = None
) -> Iterator[System]:
    """One scheduler with the generation worker and one API, yielded once a completion
    has been answered (the worker loads its weights and the consumers join first)."""
    sys_ = build_system(services, workdir, extra_env=extra_env)
    try:
        sys_.start_scheduler(workers=1, models=MODEL)
        sys_.url = sys_.start_api()
        deadline = time.time() + 180
        while True:
            r = httpx.post(
                f"{sys_.url}/v1/completions",
                headers=sys_.headers(),
                json={"model": MODEL, "prompt": "warm up", "max_tokens": 2, "temperature": 0},
                timeout=60,
            )
            if r.status_code == 200:
                break
            assert time.time() < deadline, r.text
            time.sleep(1)
        yield sys_
    finally:
        sys_.close()
