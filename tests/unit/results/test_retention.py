"""Which partitions to make and drop, and what retention leaves to row deletion."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from results.retention import (
    Layout,
    Partition,
    keep_for,
    partition_name,
    row_cutoffs,
    slot_start,
    to_create,
    to_drop,
)

DAY = timedelta(days=1)
HOUR = timedelta(hours=1)
NOW = datetime(2026, 11, 26, 13, 30, tzinfo=UTC)
MIDNIGHT = datetime(2026, 11, 26, tzinfo=UTC)


def daily(table: str, lo: datetime) -> Partition:
    return Partition(table, partition_name(table, lo, DAY), lo, lo + DAY)


def test_slots_are_aligned_to_the_epoch_in_utc() -> None:
    assert slot_start(NOW, DAY) == MIDNIGHT
    assert slot_start(NOW, 6 * HOUR) == datetime(2026, 11, 26, 12, tzinfo=UTC)
    other_zone = NOW.astimezone(__import__("zoneinfo").ZoneInfo("Asia/Tokyo"))
    assert slot_start(other_zone, DAY) == MIDNIGHT


def test_names_say_the_day_or_the_hour() -> None:
    assert partition_name("requests", MIDNIGHT, DAY) == "requests_p20261126"
    assert partition_name("requests", MIDNIGHT + 5 * HOUR, HOUR) == "requests_p2026112605"


def test_an_empty_table_gets_today_and_the_days_ahead() -> None:
    made = to_create("requests", NOW, [], Layout(DAY, 3 * DAY))
    assert [s.name for s in made] == [
        "requests_p20261126",
        "requests_p20261127",
        "requests_p20261128",
        "requests_p20261129",
    ]
    assert all(s.upper - s.lower == DAY for s in made)


def test_existing_partitions_are_left_and_only_the_missing_made() -> None:
    have = [daily("requests", MIDNIGHT), daily("requests", MIDNIGHT + DAY)]
    made = to_create("requests", NOW, have, Layout(DAY, 2 * DAY))
    assert [s.lower for s in made] == [MIDNIGHT + 2 * DAY]


def test_the_old_table_partition_is_continued_from_its_cutover() -> None:
    legacy = Partition("requests", "requests_legacy", None, MIDNIGHT + 2 * DAY)
    made = to_create("requests", NOW, [legacy], Layout(DAY, 3 * DAY))
    assert [s.lower for s in made] == [MIDNIGHT + 2 * DAY, MIDNIGHT + 3 * DAY]


def test_a_gap_left_while_nothing_ran_is_filled() -> None:
    old = daily("requests", MIDNIGHT - 5 * DAY)
    made = to_create("requests", NOW, [old], Layout(DAY, DAY))
    assert made[0].lower == MIDNIGHT - 4 * DAY and made[-1].lower == MIDNIGHT + DAY
    assert len(made) == 6


def test_a_narrower_interval_fills_around_wider_partitions_without_overlap() -> None:
    have = [daily("requests", MIDNIGHT)]
    made = to_create("requests", NOW, have, Layout(6 * HOUR, 12 * HOUR))
    assert [s.lower for s in made] == [MIDNIGHT + DAY]  # 13:30 + 12 h is in its slot
    assert made[0].name == "requests_p2026112700"


def test_each_table_is_planned_on_its_own() -> None:
    have = [daily("refusals", MIDNIGHT)]
    assert to_create("requests", NOW, have, Layout(DAY, DAY))[0].lower == MIDNIGHT
    assert to_create("refusals", NOW, have, Layout(DAY, DAY))[0].lower == MIDNIGHT + DAY


def test_a_partition_is_dropped_once_all_of_it_is_older_than_retention() -> None:
    keep = 30 * DAY
    edge = daily("requests", MIDNIGHT - 31 * DAY)  # ends 30 days before midnight
    straddling = daily("requests", MIDNIGHT - 30 * DAY)  # ends after now - 30 days
    legacy = Partition("requests", "requests_legacy", None, MIDNIGHT - 40 * DAY)
    dropped = to_drop(NOW, [edge, straddling, legacy], keep)
    assert dropped == [edge, legacy]


def test_the_partitions_keep_the_longest_retention() -> None:
    assert keep_for(30, []) == 30 * DAY
    assert keep_for(30, [7, 90]) == 90 * DAY


def test_shorter_tenant_retention_is_deleted_row_by_row() -> None:
    cuts = row_cutoffs(NOW, 30, {"a": 7, "b": 30})
    assert cuts.tenants == {"a": NOW - 7 * DAY} and cuts.others is None


def test_a_longer_tenant_retention_leaves_everyone_elses_rows_to_the_sweeper() -> None:
    cuts = row_cutoffs(NOW, 30, {"long": 365, "short": 7})
    assert cuts.others == NOW - 30 * DAY
    assert cuts.tenants == {"short": NOW - 7 * DAY}
    assert cuts.explicit == frozenset({"long", "short"})


def test_layout_limits() -> None:
    with pytest.raises(ValueError):
        Layout(timedelta(minutes=30), DAY)
    with pytest.raises(ValueError):
        Layout(DAY, HOUR)
