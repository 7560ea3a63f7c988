"""``gristmill dev``'s restart policy (gristmill/restarts.py): at once after a
healthy run, a doubling pause while a process keeps dying young, capped."""

from __future__ import annotations

from gristmill.restarts import MAX_DELAY_S, STABLE_S, RestartPolicy


def test_a_process_that_ran_is_restarted_at_once() -> None:
    p = RestartPolicy()
    p.started("scheduler", now=0.0)
    assert p.died("scheduler", now=STABLE_S + 5) == STABLE_S + 5
    assert p.restarts("scheduler") == 1


def test_a_crash_loop_waits_longer_each_time_up_to_the_cap() -> None:
    p = RestartPolicy()
    now = 0.0
    p.started("api", now)
    waits = []
    for _ in range(8):
        now += 2.0  # dies two seconds after each start
        at = p.died("api", now)
        waits.append(at - now)
        now = at
        p.started("api", now)
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, MAX_DELAY_S, MAX_DELAY_S, MAX_DELAY_S]
    assert p.restarts("api") == 8


def test_a_run_long_enough_ends_the_crash_loop() -> None:
    p = RestartPolicy()
    p.started("api", 0.0)
    at = p.died("api", 1.0)
    p.started("api", at)
    died = at + 1.0
    at = p.died("api", died)
    assert at - died == 2.0  # the second crash in a row waits 2 s
    p.started("api", at)
    assert p.died("api", at + STABLE_S) == at + STABLE_S  # it ran: at once again


def test_processes_are_counted_apart() -> None:
    p = RestartPolicy()
    p.started("api", 0.0)
    p.started("scheduler", 0.0)
    p.died("api", 1.0)
    assert p.restarts("api") == 1 and p.restarts("scheduler") == 0
    assert p.died("scheduler", 1.0) == 2.0  # its own first crash: 1 s, not the api's 2 s
