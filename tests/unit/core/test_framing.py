"""core/framing.py reads what Connection.send writes, whole, in order, to the end."""

from __future__ import annotations

import threading
from multiprocessing import Pipe

import numpy as np
import pytest

from core.framing import WholeReader


def test_messages_of_every_size_arrive_whole_and_in_order() -> None:
    a, b = Pipe(duplex=True)  # a socket pair, as a worker's connection is a socket
    big = np.arange(1024 * 384, dtype=np.float32).reshape(1024, 384)  # 1.5 MiB of answers
    sent = [{"n": 1}, big, "x" * 100_000, b"", big[:3]]

    def sender() -> None:  # the worker's side: a plain Connection.send
        for m in sent:
            a.send(m)
        a.close()

    t = threading.Thread(target=sender)
    t.start()
    reader = WholeReader(b)
    got = [reader.recv() for _ in sent]
    with pytest.raises(EOFError):
        reader.recv()
    t.join()
    reader.release()
    assert got[0] == {"n": 1} and got[2] == sent[2] and got[3] == b""
    np.testing.assert_array_equal(got[1], big)
    np.testing.assert_array_equal(got[4], big[:3])


def test_the_connection_keeps_its_descriptor() -> None:
    a, b = Pipe(duplex=True)
    reader = WholeReader(b)
    a.send("hello")
    assert reader.recv() == "hello"
    reader.release()
    b.send("still open")  # released, not closed: the connection still works both ways
    assert a.recv() == "still open"
    a.send("back")
    assert b.recv() == "back"
