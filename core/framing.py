"""Reading a ``multiprocessing.connection`` message in one wait (the worker's answers).

``Connection.recv`` reads a message a socket buffer at a time (about 200 KiB), and takes
the interpreter lock back after every read. A batch's embeddings are larger than that
(1,024 rows of 384 floats: 1.5 MiB), and a scheduler's reader thread shares the lock with
its Kafka lanes and results writers: on an H200 host its worker spent 18% of its time
blocked in ``send`` and batches waited 29 ms (median) between formed and started while
the GPU was 39% busy (docs/bench/gpu-host.md, r7). ``recv_into(..., MSG_WAITALL)`` waits
for the whole message in the kernel, without the lock, and takes it back once.

The wire format is ``Connection``'s own (a 4-byte big-endian length, -1 and 8 more bytes
past 2 GiB, then the pickle), so the sending side stays a plain ``Connection.send``.
"""

from __future__ import annotations

import pickle
import socket
import struct
from multiprocessing.connection import Connection
from typing import Any

_LONG = -1  # the 4-byte length that announces an 8-byte one (messages past 2 GiB)


class WholeReader:
    """Receives what the other end's ``Connection.send`` sent, a message at a time. It
    borrows the connection's descriptor (never closes it): the connection still owns it."""

    def __init__(self, conn: Connection):
        self._sock = socket.socket(fileno=conn.fileno())
        self._sock.setblocking(True)

    def recv(self) -> Any:
        """The next message; EOFError when the other end closed."""
        (size,) = struct.unpack("!i", self._exact(4))
        if size == _LONG:
            (size,) = struct.unpack("!Q", self._exact(8))
        return pickle.loads(self._exact(size))

    def release(self) -> None:
        """Let go of the descriptor without closing it."""
        self._sock.detach()

    def _exact(self, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:  # MSG_WAITALL may still return early, on a signal
            k = self._sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
            if k == 0:
                raise EOFError("the other end closed the connection")
            got += k
        return buf
