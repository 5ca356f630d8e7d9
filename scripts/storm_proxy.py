"""A throttling HTTP proxy in front of a loopback S3 (moto) or Azure (Azurite) server.

Why: a boot storm is decided by the stores' request-rate limits, which no emulator enforces.
This proxy enforces them with token buckets, as the stores publish them, and answers above them
as the stores do:

* ``--kind s3``: one bucket per *prefix* (bucket name + key up to its last ``/``), S3's
  "5,500 GET/HEAD per second per partitioned prefix"; above it ``503 SlowDown`` (S3's XML error,
  no ``Retry-After``: S3 sends none);
* ``--kind azure``: one bucket per *blob* (Azure's "up to 500 requests per second for a single
  blob"); above it ``503 ServerBusy`` (``x-ms-error-code`` and XML), with ``Retry-After`` when
  ``--retry-after`` is given.

Only GET and HEAD of objects are metered (a boot reads; the bench's setup writes before the
storm). ``/__storm/stats`` answers the counts as JSON; ``POST /__storm/reset?rate=R&burst=B``
zeroes them and refills every bucket (rate 0: no throttling). Loopback only.

Run: ``python scripts/storm_proxy.py --kind s3 --upstream 127.0.0.1:PORT --port PORT2``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "proxy-connection",
    "te",
    "upgrade",
    "content-length",
}


class Buckets:
    """Token buckets by key: ``rate`` tokens per second, at most ``burst`` held; rate 0 =
    unlimited."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset(0.0, 1.0)

    def reset(self, rate: float, burst: float) -> None:
        with self.lock:
            self.rate, self.burst = rate, max(1.0, burst)
            self.tokens: dict[str, tuple[float, float]] = {}
            self.requests = 0
            self.throttled = 0
            self.by_key: dict[str, int] = {}

    def take(self, key: str) -> bool:
        with self.lock:
            self.requests += 1
            self.by_key[key] = self.by_key.get(key, 0) + 1
            if self.rate <= 0:
                return True
            now = time.monotonic()
            held, then = self.tokens.get(key, (self.burst, now))
            held = min(self.burst, held + (now - then) * self.rate)
            if held >= 1.0:
                self.tokens[key] = (held - 1.0, now)
                return True
            self.tokens[key] = (held, now)
            self.throttled += 1
            return False

    def stats(self) -> dict[str, object]:
        with self.lock:
            return {
                "requests": self.requests,
                "throttled": self.throttled,
                "by_key": dict(self.by_key),
                "rate": self.rate,
                "burst": self.burst,
            }


def make_handler(kind: str, upstream: str, buckets: Buckets, retry_after: int | None) -> type:
    local = threading.local()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _conn(self) -> http.client.HTTPConnection:
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = http.client.HTTPConnection(upstream, timeout=30)
            return conn

        def _reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _key(self) -> str:
            path = urlparse(self.path).path
            return path.rsplit("/", 1)[0] + "/" if kind == "s3" else path

        def _throttle(self) -> None:
            if kind == "s3":
                body = (
                    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                    b"<Message>Please reduce your request rate.</Message></Error>"
                )
                self._reply(503, body, {"Content-Type": "application/xml"})
                return
            body = (
                b'\xef\xbb\xbf<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code>'
                b"<Message>The server is currently unable to receive requests. Please retry your "
                b"request."
                b"</Message></Error>"
            )
            headers = {"Content-Type": "application/xml", "x-ms-error-code": "ServerBusy"}
            if retry_after is not None:
                headers["Retry-After"] = str(retry_after)
            self._reply(503, body, headers)

        def _control(self) -> bool:
            parsed = urlparse(self.path)
            if not parsed.path.startswith("/__storm/"):
                return False
            if parsed.path == "/__storm/reset":
                q = parse_qs(parsed.query)
                buckets.reset(float(q.get("rate", ["0"])[0]), float(q.get("burst", ["1"])[0]))
            self._reply(
                200, json.dumps(buckets.stats()).encode(), {"Content-Type": "application/json"}
            )
            return True

        def _forward(self) -> None:
            if self._control():
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if self.command in ("GET", "HEAD") and not buckets.take(self._key()):
                self._throttle()
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            for attempt in range(2):  # a pooled upstream connection the server closed: once more
                try:
                    conn = self._conn()
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    break
                except (http.client.HTTPException, OSError):
                    local.conn = None
                    if attempt:
                        self._reply(502, b"upstream failed", {})
                        return
            out = {k: v for k, v in resp.getheaders() if k.lower() not in HOP}
            self._reply(resp.status, data, out)

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

    return Handler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", choices=["s3", "azure"], required=True)
    ap.add_argument("--upstream", required=True, help="host:port of the real server")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument(
        "--retry-after", type=int, default=None, help="seconds in Retry-After of a throttled answer"
    )
    args = ap.parse_args()
    ThreadingHTTPServer.request_queue_size = (
        1024  # read at bind: a storm's connections queue, not refused
    )
    server = ThreadingHTTPServer(
        ("127.0.0.1", args.port),
        make_handler(args.kind, args.upstream, Buckets(), args.retry_after),
    )
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
