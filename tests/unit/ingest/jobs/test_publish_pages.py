"""The publisher's read-back (JobPublisher._unsent_pages): windows of item indexes that
cover the job once, in order, whatever is already sent (pure: the page query is
replaced by a list)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.jobs import publisher as job_submit
from ingest.jobs.publisher import JobPublisher


def pages_of(total: int, sent: set[int], monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    windows: list[tuple[int, int]] = []

    def unsent_page(_engine: Any, _job: str, after: int, width: int) -> list[Any]:
        windows.append((after, width))
        last = min(after + width, total - 1)
        return [(i, '"x"', f"r{i}", 0) for i in range(after + 1, last + 1) if i not in sent]

    monkeypatch.setattr(job_submit, "unsent_page", unsent_page)
    publisher = object.__new__(JobPublisher)  # no producer or pool: only the pages
    publisher.engine = None  # type: ignore[assignment]
    sizes: list[int] = []
    out = []
    for page in publisher._unsent_pages("job", total, sizes):
        out.append(list(page))
        sizes.append(600 * len(page))  # what the publish loop records: bytes sent
    # Every window starts where the last one ended, and none starts past the job.
    for (a, w), (b, _) in itertools.pairwise(windows):
        assert b == a + w
    assert all(after < total - 1 for after, _ in windows)
    return out


@given(st.integers(min_value=1, max_value=30_000), st.data())
def test_every_unsent_item_once_in_order(total: int, data: st.DataObject) -> None:
    sent = set(data.draw(st.lists(st.integers(min_value=0, max_value=total - 1), max_size=50)))
    with pytest.MonkeyPatch.context() as mp:
        pages = pages_of(total, sent, mp)
    got = [item[0] for page in pages for item in page]
    assert got == [i for i in range(total) if i not in sent]
    assert all(page for page in pages)  # an empty window is skipped, not yielded


def test_a_job_already_sent_costs_windows_not_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    assert pages_of(5_000, set(range(5_000)), monkeypatch) == []
