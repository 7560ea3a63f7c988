"""Settings read from an environment mapping, as a started process would read them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.config import Settings, settings_from_env


def test_plain_and_json_fields_are_read_like_the_process_reads_them() -> None:
    s = settings_from_env(
        {
            "GRISTMILL_WORKERS": "3",
            "GRISTMILL_TIER_SLO_MS": '{"free": 6000, "paid": 2500, "enterprise": 900}',
            "KAFKA_BOOTSTRAP": "127.0.0.1:19092",
        }
    )
    assert s.workers == 3
    assert s.tier_slo_ms == {"free": 6000, "paid": 2500, "enterprise": 900}
    assert s.kafka_bootstrap == "127.0.0.1:19092"


def test_a_tier_out_of_order_names_the_field_and_both_tiers() -> None:
    with pytest.raises(ValidationError) as err:
        Settings(tier_slo_ms={"enterprise": 3_000, "paid": 2_000, "free": 5_000})
    msg = str(err.value)
    assert "tier_slo_ms" in msg and "paid" in msg and "enterprise" in msg
    with pytest.raises(ValidationError, match="tier_rate_rps"):
        Settings(tier_rate_rps={"free": 300.0, "paid": 200.0})


def test_shed_thresholds_start_below_where_they_refuse_all() -> None:
    with pytest.raises(ValidationError, match=r"loop_lag_shed_ms\[paid\]"):
        Settings(loop_lag_shed_ms={"paid": (300.0, 100.0)})


def test_linger_and_margin_must_fit_in_the_smallest_slo() -> None:
    with pytest.raises(ValidationError) as err:
        Settings(max_linger_ms=990)
    msg = str(err.value)
    assert "max_linger_ms" in msg and "tier_slo_ms" in msg and "deadline_margin_ms" in msg


def test_constrained_fields() -> None:
    for bad in (
        {"topic_partitions": 0},
        {"api_port": 70_000},
        {"max_buffered": 0},
        {"embed_max_tokens": 1_000},
        {"max_linger_ms": -1},
    ):
        with pytest.raises(ValidationError):
            Settings(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="default_timeout_ms"):
        Settings(default_timeout_ms=400_000)


@pytest.mark.parametrize(
    ("part", "whole"),
    [
        ("default_timeout_ms", "max_timeout_ms"),
        ("max_uploads_per_tenant", "max_uploads"),
        ("max_follow_streams_per_tenant", "max_follow_streams"),
        ("max_job_json_bytes", "max_job_bytes"),
        ("default_completion_window_s", "max_completion_window_s"),
        ("max_job_json_items", "max_job_items"),
        ("min_output_expires_s", "max_output_expires_s"),
    ],
)
def test_a_part_above_its_whole_names_both_and_their_values(part: str, whole: str) -> None:
    bound = getattr(Settings(), whole)
    with pytest.raises(ValidationError) as err:
        Settings(**{part: bound + 1})
    assert f"{part} ({bound + 1}) must not exceed {whole} ({bound})" in str(err.value)
    Settings(**{part: bound})  # equal is allowed


def test_per_tier_values_keep_their_bounds() -> None:
    for bad in (
        {"tier_rate_rps": {"free": 0.0}},
        {"tier_max_streams": {"free": 0}},
        {"inflight_share": {"free": 1.5}},
        {"tier_file_count": {"free": 0}},
    ):
        with pytest.raises(ValidationError):
            Settings(**bad)  # type: ignore[arg-type]


def test_the_defaults_and_the_environment_still_agree() -> None:
    s = settings_from_env({"DATABASE_URL": "postgresql://x/y", "GRISTMILL_MAX_LINGER_MS": "10"})
    assert s.database_url == "postgresql://x/y" and s.max_linger_ms == 10
    assert s.batch_budget() == (1_000 - 10 - 20) / 2
    assert s.batch_budgets() == ((1_000 - 30) / 2, (2_000 - 30) / 2, (5_000 - 30) / 2)
