"""A scheduler process whose paid lane has a bug: the first fetch it hands over raises.

Test-only (tests/e2e/test_supervision.py): ``python -m tests.e2e.broken_lane`` takes
the arguments of ``gristmill scheduler``. Nothing in the product knows of it; it
replaces the feed's ``accept`` on the paid lane's thread before the scheduler starts.
"""

from __future__ import annotations

import sys
import threading

from gristmill.cli.main import app
from scheduler.runtime.feed import Feed

LANE = "lane-paid"  # the thread of the lane that reads the paid class
BUG = "injected: a bug in the paid lane"
_accept = Feed.accept


def _broken(self: Feed, *args: object, **kw: object) -> None:
    if threading.current_thread().name == LANE:
        raise RuntimeError(BUG)
    _accept(self, *args, **kw)  # type: ignore[arg-type]


if __name__ == "__main__":
    Feed.accept = _broken  # type: ignore[method-assign]
    app(["scheduler", *sys.argv[1:]])
