"""What the policy's events become on their way to the callers. Pure.

The step loop hands each step's events here; a flusher takes everything gathered so
far (``take``) and writes it in one PostgreSQL transaction (decision 24):

* for a request still generating, its new tokens as one row of its progress (a
  ``ProgressRow``: token ids and the text each released), so a stream that
  reconnects, or the next owner after a crash, knows what was delivered;
* for a finished one, its ``Ending``: the request log's final row is written instead
  (its progress rows are deleted in the same transaction);
* for both, a wake-up naming the request on the streams' channel, sent in that same
  transaction (results/generation.py); a stream then reads its new tokens or its end
  from the database, so a caller never sees a token the database does not hold.

The text offsets of an ending (characters released up to and including each token)
let a caller who reconnects after the end resume after any token it saw.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from scheduler.core.generation.events import Event, Finished, Preempted, Token


@dataclass(frozen=True)
class ProgressRow:
    request_id: str
    tenant_id: str
    first_index: int
    token_ids: tuple[int, ...]
    texts: tuple[str, ...]


@dataclass(frozen=True)
class Ending:
    request_id: str
    finished: Finished
    offsets: tuple[int, ...]  # text released up to and including each output token

    @property
    def completion_tokens(self) -> int:
        return len(self.offsets)


@dataclass
class Flush:
    progress: list[ProgressRow] = field(default_factory=list)
    endings: list[Ending] = field(default_factory=list)
    # (request id, first index, texts) of every request that streamed new tokens
    tokens: list[tuple[str, int, tuple[str, ...]]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.progress or self.endings or self.tokens)


@dataclass
class _Stream:
    tenant_id: str
    next_index: int  # the index of the first token not taken yet
    offsets: list[int]
    ids: list[int] = field(default_factory=list)  # taken since the last flush
    texts: list[str] = field(default_factory=list)
    ending: Finished | None = None


class Outbox:
    def __init__(self) -> None:
        self._streams: dict[str, _Stream] = {}
        self.preemptions = 0

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._streams

    def open(self, request_id: str, tenant_id: str, prior_texts: Sequence[str] = ()) -> None:
        """A request joins; ``prior_texts``: what earlier runs streamed (one per token)."""
        offsets, n = [], 0
        for t in prior_texts:
            n += len(t)
            offsets.append(n)
        self._streams[request_id] = _Stream(tenant_id, len(prior_texts), offsets)

    def drop(self, request_id: str) -> None:
        """Forget a request without a word (its partition moved: the new owner goes on)."""
        self._streams.pop(request_id, None)

    def add(self, events: Iterable[Event]) -> None:
        for e in events:
            s = self._streams.get(e.seq_id)
            if s is None:
                continue
            if isinstance(e, Token):
                if e.index != s.next_index + len(s.ids):
                    raise ValueError(
                        f"{e.seq_id}: token {e.index} after {s.next_index + len(s.ids) - 1}"
                    )
                s.ids.append(e.token_id)
                s.texts.append(e.text)
                s.offsets.append((s.offsets[-1] if s.offsets else 0) + len(e.text))
            elif isinstance(e, Finished):
                s.ending = e
            elif isinstance(e, Preempted):
                self.preemptions += 1

    def take(self) -> Flush:
        out = Flush()
        for rid, s in list(self._streams.items()):
            if s.ids:
                out.tokens.append((rid, s.next_index, tuple(s.texts)))
                if s.ending is None:
                    out.progress.append(
                        ProgressRow(rid, s.tenant_id, s.next_index, tuple(s.ids), tuple(s.texts))
                    )
                s.next_index += len(s.ids)
                s.ids, s.texts = [], []
            if s.ending is not None:
                out.endings.append(Ending(rid, s.ending, tuple(s.offsets)))
                del self._streams[rid]
        return out


def end_note(e: Ending, status: str) -> dict[str, object]:
    """What a stream needs to end: how many tokens there were, the text not yet sent,
    why it ended, and the usage (OpenAI's final chunk)."""
    f = e.finished
    return {
        "id": e.request_id,
        "n": e.completion_tokens,
        "tail": f.tail,
        "reason": str(f.reason),
        "status": status,
        "prompt_tokens": f.prompt_tokens,
    }
