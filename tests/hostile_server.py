"""An HTTP endpoint that answers every request the way one hypothesis draw says.

A draw is status x length header x body (size and shape) x timing. Bodies are streamed from
one 64 KiB chunk, so a 200 MiB body is never held by the server either. Redirects point at
``canary``, a second listener that records every connection it gets: a client that follows
one shows up there.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from store_servers import LoopbackServer

STATUSES = (200, 206, 301, 307, 400, 403, 404, 416, 500, 503)
LENGTHS = ("honest", "short", "long", "huge", "chunked", "missing")
BODIES = {"empty": 0, "small": 300, "cap+1": 64 * 1024 + 1, "200MiB": 200 << 20}
TIMINGS = ("fast", "trickle", "stall")
TRICKLE = (512, 0.05)
"""bytes per write, pause between writes"""
STALL = 5.0
"""seconds of silence after the headers: longer than any budget the tests use"""

_CHUNK = b"<Error><Code>InternalError</Code><Message>" + b"x" * 65536


@dataclass(frozen=True)
class Draw:
    status: int
    length: str
    body: str
    timing: str


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        draw = self.server.draw
        size = BODIES[draw.body]
        self.send_response(draw.status)
        if draw.status in (301, 307):
            self.send_header("Location", f"{self.server.canary}{self.path}")
        declared = {"honest": size, "short": size // 2, "long": size + 1000, "huge": 1 << 40}.get(
            draw.length
        )
        if draw.length == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
        elif declared is not None:
            self.send_header("Content-Length", str(declared))
        self.send_header("Content-Type", "application/xml")
        self.end_headers()
        self.close_connection = draw.length != "honest"
        try:
            if draw.timing == "stall":
                self.wfile.flush()
                time.sleep(STALL)
            self._body(size, draw)
        except OSError:
            self.close_connection = True

    do_HEAD = do_GET

    def _body(self, size: int, draw: Draw) -> None:
        step, pause = TRICKLE if draw.timing == "trickle" else (len(_CHUNK), 0.0)
        sent = 0
        while sent < size:
            piece = _CHUNK[: min(step, size - sent)]
            if draw.length == "chunked":
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            else:
                self.wfile.write(piece)
            sent += len(piece)
            if pause:
                self.wfile.flush()
                time.sleep(pause)
        if draw.length == "chunked":
            self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class Canary:
    """A listener that records every connection and answers none."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.endpoint = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self._stop = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def stop(self) -> None:
        self._stop = True
        self.thread.join(2)
        self.sock.close()


class HostileServer(LoopbackServer):
    def __init__(self, canary: Canary) -> None:
        super().__init__(
            _Handler, canary=canary.endpoint, draw=Draw(200, "honest", "empty", "fast")
        )

    def set(self, draw: Draw) -> None:
        self.httpd.draw = draw
