"""The stop-signal policy: first signal orderly, a later one at once, a burst is one."""

from __future__ import annotations

from gristmill.devservices.stopsignals import REPEAT_S, Stop, StopSignals, after_signal


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_first_signal_asks_for_an_orderly_stop() -> None:
    assert after_signal(Stop.RUN, None, 0.0) is Stop.ORDERLY


def test_a_second_signal_at_once_is_the_same_request() -> None:
    # make forwards SIGTERM to its child: both copies land within milliseconds.
    assert after_signal(Stop.ORDERLY, 10.0, 10.0 + 0.002) is Stop.ORDERLY
    assert after_signal(Stop.ORDERLY, 10.0, 10.0 + REPEAT_S - 1e-6) is Stop.ORDERLY


def test_a_later_signal_stops_at_once() -> None:
    assert after_signal(Stop.ORDERLY, 10.0, 10.0 + REPEAT_S) is Stop.NOW
    assert after_signal(Stop.NOW, 10.0, 99.0) is Stop.NOW


def test_handler_sets_events_and_calls_on_now_once() -> None:
    clock, killed = Clock(), []
    stop = StopSignals(on_now=lambda: killed.append(clock.t), clock=clock)
    stop.handle()
    assert stop.orderly.is_set() and not stop.now.is_set()
    clock.t += 0.01
    stop.handle()  # the forwarded copy
    assert not stop.now.is_set() and killed == []
    clock.t += 2.0
    stop.handle()  # a person's second Ctrl-C
    assert stop.now.is_set() and killed == [clock.t]
    clock.t += 2.0
    stop.handle()
    assert killed == [clock.t - 2.0]  # killed once; the handler never raises


def test_repeat_window_counts_from_the_first_signal() -> None:
    clock = Clock()
    stop = StopSignals(clock=clock)
    stop.handle()
    for _ in range(10):  # a burst, each within the window of the one before ...
        clock.t += REPEAT_S / 4
        stop.handle()
    assert stop.now.is_set()  # ... still ends in "now" once the first is old enough
