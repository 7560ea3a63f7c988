"""A sequence's output text, released as it becomes final; stop strings cut it.

Text is decoded as tokens come (byte-level BPE: a token may end inside a UTF-8
character, which then decodes as U+FFFD until the next token completes it, so a
trailing U+FFFD is held back). Once the text decoded so far ends on a whole
character, those tokens never change it again: only the tokens after them are
decoded at the next push, so a long answer costs O(1) per token, not O(length).
With stop strings, the last ``longest stop - 1`` characters are held back too: they
could be the start of a stop string, and text already streamed to a caller cannot be
taken back. On a stop the text ends just before the stop string (OpenAI's ``stop``:
not included).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Detokenize = Callable[[Sequence[int]], str]


class IncrementalText:
    __slots__ = ("_decode", "_hold", "_stable_ids", "_stable_text", "_stops", "emitted", "text")

    def __init__(self, decode: Detokenize, stops: Sequence[str] = ()):
        self._decode = decode
        self._stops = tuple(s for s in stops if s)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self.text = ""  # decoded so far (final once finished)
        self.emitted = 0  # characters of text already released
        self._stable_ids = 0  # leading output ids whose text is final ...
        self._stable_text = ""  # ... and that text

    def push(self, output_ids: Sequence[int]) -> tuple[str, bool]:
        """The newly releasable text for the output so far, and whether a stop string
        ended it (then the returned text is the last piece)."""
        text = self._stable_text + self._decode(output_ids[self._stable_ids :])
        if not text.endswith("\ufffd"):
            self._stable_ids, self._stable_text = len(output_ids), text
        if self._stops:
            # A stop can only start at or after what was released (see module doc).
            cut = min(
                (i for i in (text.find(s, self.emitted) for s in self._stops) if i >= 0),
                default=-1,
            )
            if cut >= 0:
                self.text = text[:cut]
                return self._release(cut), True
        self.text = text
        end = len(text) - self._hold
        while end > self.emitted and text[end - 1] == "\ufffd":
            end -= 1
        return self._release(end), False

    def flush(self) -> str:
        """Everything not yet released (the sequence finished without a stop string)."""
        return self._release(len(self.text))

    def _release(self, end: int) -> str:
        if end <= self.emitted:
            return ""
        out = self.text[self.emitted : end]
        self.emitted = end
        return out
