"""core/redact.py: no password, API key or webhook secret in a log line or a file others read."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from core.redact import RedactingFilter, redact, write_private
from results.tenants import new_key

KEY = new_key()


@pytest.mark.parametrize(
    "text,secret",
    [
        ("DATABASE_URL=postgresql+psycopg://gm:s3cr3t-pw@db:5432/gm", "s3cr3t-pw"),
        ("connect postgres://user:p%40ss@host/db failed", "p%40ss"),
        ("host=db user=gm password=hunter2 dbname=gm", "hunter2"),
        ("conninfo: password='with space' host=x", "with space"),
        (f"Authorization: Bearer {KEY}", KEY[8:]),
        ("secret whsec_AbCdEfGhIjKlMnOp123 issued", "AbCdEfGhIjKlMnOp123"),
    ],
)
def test_secrets_are_masked(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out and "***" in out


def test_ordinary_text_is_untouched() -> None:
    for text in ("batch of 17 persisted in 3 ms", "http://127.0.0.1:8000/v1/infer", "gm_ alone"):
        assert redact(text) == text


def test_the_filter_masks_messages_arguments_and_tracebacks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("test.redact")
    caplog.handler.addFilter(RedactingFilter())
    url = "postgresql://gm:tops3cret@127.0.0.1/gm"
    with caplog.at_level(logging.WARNING, logger="test.redact"):
        logger.warning("cannot reach %s", url)
        try:
            raise RuntimeError(f"connect failed for {url} with key {KEY}")
        except RuntimeError:
            logger.exception("listener failed")
    assert "tops3cret" not in caplog.text and KEY not in caplog.text
    assert "RuntimeError" in caplog.text  # the traceback is still there, masked


def test_private_files_are_0600_even_when_they_existed_wider(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "dev.env"
    write_private(path, "GRISTMILL_API_KEY=x\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)
    write_private(path, b"new")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_bytes() == b"new"
