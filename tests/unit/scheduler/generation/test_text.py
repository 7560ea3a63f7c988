"""Incremental text: UTF-8 pieces held back, stop strings cut and never streamed."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.core.generation.text import IncrementalText


def byte_decode(ids: Sequence[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


def stream(text: str, stops: Sequence[str] = ()) -> tuple[list[str], str, bool, str]:
    inc = IncrementalText(byte_decode, stops)
    ids: list[int] = []
    pieces: list[str] = []
    for b in text.encode():
        ids.append(b)
        piece, stopped = inc.push(ids)
        pieces.append(piece)
        if stopped:
            return pieces, inc.text, True, inc.flush()
    return pieces, inc.text, False, inc.flush()


def test_plain_text_streams_byte_by_byte_and_joins_back() -> None:
    pieces, text, stopped, tail = stream("plain text")
    assert "".join(pieces) + tail == text == "plain text" and not stopped


def test_a_character_split_across_tokens_is_held_until_complete() -> None:
    pieces, _, _, tail = stream("añb€")
    assert "\ufffd" not in "".join(pieces)
    assert "".join(pieces) + tail == "añb€"
    assert pieces[1] == "" and pieces[2] == "ñ"  # ñ is two bytes


def test_stop_string_ends_the_text_before_it() -> None:
    pieces, text, stopped, tail = stream("answer: 42\n\nnext question", stops=["\n\n"])
    assert stopped and text == "answer: 42" and "".join(pieces) + tail == "answer: 42"


def test_the_earliest_of_several_stops_wins_and_a_partial_match_is_released() -> None:
    pieces, text, stopped, _ = stream("a END b STOP c", stops=["STOP", "END!"])
    assert stopped and text == "a END b "
    assert "".join(pieces) == "a END b "


def test_a_prefix_of_a_stop_string_is_never_streamed_early() -> None:
    inc = IncrementalText(byte_decode, ["###"])
    out = "".join(inc.push(list(b"ab##"[: i + 1]))[0] for i in range(4))
    assert out == "ab"  # "##" may still become "###"
    piece, stopped = inc.push(list(b"ab##x"))
    # Two characters stay held (the longest stop minus one): "#x" could not start "###"
    # any more, but the rule is kept simple and only holds text back, never loses it.
    assert not stopped and out + piece == "ab#" and inc.flush() == "#x"


def test_stop_at_the_very_start_gives_empty_text() -> None:
    _, text, stopped, tail = stream("STOP and more", stops=["STOP"])
    assert stopped and text == "" and tail == ""
