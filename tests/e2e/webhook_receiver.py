"""A local endpoint that records the webhooks it receives (the e2e system allows
loopback destinations)."""

from __future__ import annotations

import http.server
import threading
from typing import Any


class Hook(http.server.BaseHTTPRequestHandler):
    received: list[tuple[bytes, dict[str, str]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Hook.received.append((body, {k.lower(): v for k, v in self.headers.items()}))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def serve() -> http.server.HTTPServer:
    """A started receiver on a free loopback port, nothing received yet; ``shutdown()``
    it when done."""
    Hook.received.clear()
    server = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
