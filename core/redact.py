"""Secrets kept out of logs and out of world-readable files.

What counts as a secret here: the password of a connection URL
(``postgresql://user:PASSWORD@host``) or of a libpq keyword string
(``password=...``), API keys (``gm_`` + 43 characters) and webhook signing secrets
(``whsec_...``). ``redact`` masks them in any text; ``install`` puts a filter that
does it on every log handler of the process, tracebacks included, so a message that
quotes a URL or an exception that carries one never writes the secret.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

MASK = "***"

_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)[^@\s]+(?=@)")
_KEYWORD_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s'&]+)", re.I)
# An API key keeps its first characters (the listing's prefix) so a reader can tell
# which key it was; webhook secrets keep none.
_API_KEY = re.compile(r"\b(?P<head>gm_[A-Za-z0-9_-]{4})[A-Za-z0-9_-]{16,}")
_WEBHOOK_SECRET = re.compile(r"\bwhsec_[A-Za-z0-9_-]{8,}")


def redact(text: str) -> str:
    if not any(marker in text for marker in ("://", "assword", "gm_", "whsec_")):
        return text  # the common case: nothing to look for, no regex run
    text = _URL_PASSWORD.sub(lambda m: m["head"] + MASK, text)
    text = _KEYWORD_PASSWORD.sub(lambda m: m["head"] + MASK, text)
    text = _API_KEY.sub(lambda m: m["head"] + MASK, text)
    return _WEBHOOK_SECRET.sub("whsec_" + MASK, text)


class RedactingFilter(logging.Filter):
    """Rewrites a record's message (and its traceback) with secrets masked."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


_FILTER = RedactingFilter()
# The loggers uvicorn configures with handlers of their own (propagate=False).
_SERVER_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


def install(level: int = logging.WARNING) -> None:
    """Mask secrets on every handler the process logs through. Call it once logging is
    configured (uvicorn configures its own before it imports the app); without a root
    handler one is added at ``level`` (records would otherwise reach Python's last
    resort handler, which no filter sees)."""
    root = logging.getLogger()
    if not root.handlers:
        stream = logging.StreamHandler()
        stream.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        stream.setLevel(level)
        root.addHandler(stream)
    for logger in (root, *(logging.getLogger(n) for n in _SERVER_LOGGERS)):
        for handler in logger.handlers:
            if _FILTER not in handler.filters:
                handler.addFilter(_FILTER)


def write_private(path: Path, content: str | bytes) -> None:
    """Write ``content`` to ``path`` readable by its owner only (0600), also when the
    file existed before with wider permissions: the secret is written after the chmod."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # O_CREAT's mode only applies to a new file
    with os.fdopen(fd, "wb") as f:
        f.write(content.encode() if isinstance(content, str) else content)
