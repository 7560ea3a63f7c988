"""Token ids that travel with a request: tokenized once in the API tier.

The API tier tokenizes a text model's input when it accepts the request (it scales
with the request rate), so the worker, which one GPU waits on, only packs ids. The
message's ``input`` then becomes ``{"text": <the client's text>, "ids": <ids>}``:
the text is what is stored and shown (``input_text``), the ids are what is computed.

Ids are carried as a string with one character per token (``chr(id)``): compact in
JSON and pickle, and a whole batch decodes in one C call (``"".join`` then UTF-32),
instead of one Python int per token. Vocabularies must stay below the surrogate
range (0xD800), which every BERT-family vocabulary does.

Light on purpose: ingest imports it; numpy is imported only to decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

MAX_ID = 0xD7FF  # below the UTF-16 surrogates, so every id is a valid JSON character


def encode_ids(ids: Sequence[int]) -> str:
    """``[101, 7592, 102]`` -> a string of those code points."""
    if any(not 0 <= i <= MAX_ID for i in ids):
        raise ValueError(f"token ids must be 0..{MAX_ID}")
    return "".join(map(chr, ids))


def decode_ids(s: str) -> list[int]:
    return [ord(c) for c in s]


def tokenized_input(text: str, ids: Sequence[int]) -> dict[str, str]:
    return {"text": text, "ids": encode_ids(ids)}


def is_tokenized(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("ids"), str)


def input_tokens(value: Any) -> int:
    """Tokens an input computes: its ids where the API tokenized it, else a text's
    words and the two special tokens a BERT-family model adds (a job item's text is not
    tokenized before the worker); any other input counts one."""
    if is_tokenized(value):
        return len(value["ids"])
    if isinstance(value, str):
        return value.count(" ") + 3
    return 1


def input_text(value: Any) -> Any:
    """What the client sent: the text of a tokenized input, anything else unchanged."""
    return value["text"] if is_tokenized(value) else value


def decode_batch(id_strings: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Many id strings -> (all ids concatenated [int32], lengths [int32], starts [int64])."""
    import numpy as np

    n = len(id_strings)
    lens = np.fromiter(map(len, id_strings), dtype=np.int32, count=n)
    flat = np.frombuffer("".join(id_strings).encode("utf-32-le"), dtype=np.uint32)
    starts = np.zeros(n, dtype=np.int64)
    if n > 1:
        np.cumsum(lens[:-1], out=starts[1:])
    return flat.view(np.int32), lens, starts
