"""Settings read from an environment mapping, as a started process would read them."""

from __future__ import annotations

from core.config import settings_from_env


def test_plain_and_json_fields_are_read_like_the_process_reads_them() -> None:
    s = settings_from_env(
        {
            "GRISTMILL_WORKERS": "3",
            "GRISTMILL_SHED_DELAY_MS": '{"free": 250, "paid": 400, "enterprise": 450}',
            "KAFKA_BOOTSTRAP": "127.0.0.1:19092",
        }
    )
    assert s.workers == 3
    assert s.shed_delay_ms == {"free": 250.0, "paid": 400.0, "enterprise": 450.0}
    assert s.kafka_bootstrap == "127.0.0.1:19092"
