"""Waiting for a running system to reach a state, for tests that watch one."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def eventually(
    read: Callable[[], Any], ok: Callable[[Any], bool], timeout_s: float = 30, every_s: float = 0.25
) -> Any:
    """``read()`` until ``ok`` holds of it or ``timeout_s`` passed; its last value."""
    deadline = time.time() + timeout_s
    value = read()
    while not ok(value) and time.time() < deadline:
        time.sleep(every_s)
        value = read()
    return value
