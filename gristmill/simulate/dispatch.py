"""The dispatch decisions the simulator drives: one pluggable piece.

The simulator asks a scheduler's dispatch core what a free worker runs next and tells
it what came back, through the interface the scheduler's runtime uses
(scheduler/core/interface.py ``SchedulerInterface``). The default is the project's own
``DispatchCore`` (scheduler/core/dispatch.py), built as a scheduler builds it; another
core that answers the same calls can be put in its place (``Scenario.dispatch`` names a
factory in ``FACTORIES``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from core.vocab import PRIORITY_CLASSES
from scheduler.core.backpressure import BufferBudget
from scheduler.core.batcher import FlushPolicy
from scheduler.core.dispatch import DispatchCore
from scheduler.core.interface import SchedulerInterface

if TYPE_CHECKING:
    from gristmill.simulate.scenario import Scenario


# The calls the simulator makes are the dispatch core's interface, as the scheduler's
# runtime makes them (scheduler/core/interface.py).
Dispatch = SchedulerInterface


def dispatch_core(sc: Scenario) -> Dispatch:
    """The scheduler's own core, with the scenario's flush policy, SLOs and buffer."""
    return DispatchCore(
        flush=FlushPolicy(sc.linger_ms / 1000, sc.margin_ms / 1000),
        batch_budget_ms=sc.batch_budgets_ms(),
        budget=BufferBudget.default(sc.max_buffered, len(PRIORITY_CLASSES)),
    )


FACTORIES: dict[str, Callable[[Scenario], Dispatch]] = {"core": dispatch_core}
