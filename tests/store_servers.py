"""Real servers on 127.0.0.1 for the store tests, started and stopped by the tests themselves.

* ``MotoServer``: moto's S3 server mode in a subprocess (s3fs talks to it over real HTTP);
* ``GcsEmulator``: ``gcp-storage-emulator`` in a subprocess (gcsfs talks to it over HTTP);
* ``Azurite``: Microsoft's Azure Storage emulator (npm ``azurite``, installed into
  ``.test-tools/`` by scripts/bootstrap-test-env.sh), blob service only, in memory, telemetry off;
* ``FaultServer``: a small threaded S3-shaped HTTP server whose objects misbehave on demand
  (500s, truncated or trickling bodies, a 1 GiB body that ignores the Range header, a
  hostile listing) and that records every request it gets; it answers Azure-shaped object
  reads too (``/<account>/<container>/<key>``, the range in ``x-ms-range``);
* ``BlackHole``: a listener that accepts connections and never answers;
* ``closed_port()``: a port nobody listens on (connection refused).

Nothing here sends a byte anywhere but loopback.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlparse
from xml.sax.saxutils import escape

import pytest

from late_ports import late_port

if TYPE_CHECKING:
    from azurite_server import Azurite
    from registry_server import DockerRegistry

LOOPBACK = "127.0.0.1"
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "plancache-test",
    "AWS_SECRET_ACCESS_KEY": "plancache-test",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def closed_port() -> int:
    """A port nobody listens on, so connecting to it is refused: one below the kernel's ephemeral
    range (tests/late_ports.py), where no server of the suite that binds port 0 can land
    meanwhile."""
    return late_port()


def wait_for_port(
    port: int, proc: subprocess.Popen[bytes] | None = None, timeout: float = 60.0
) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            socket.create_connection((LOOPBACK, port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {LOOPBACK}:{port} after {timeout} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def self_signed(directory: Path, name: str, address: str = LOOPBACK) -> tuple[Path, Path]:
    """A self-signed certificate for ``IP:<address>`` (``CN=plancache test <name>``, a CA, so it
    doubles as the bundle a client is given) and its key, as PEM files in ``directory``: for the
    servers that speak TLS on loopback (the registry, the KMS stand-ins), or on an address of a
    network namespace a test made."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"plancache test {name}")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}-cert.pem", directory / f"{name}-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class MotoServer:
    """moto's S3 server (``python -m moto.server``) on a free loopback port."""

    def __init__(self) -> None:
        self.port = late_port(LOOPBACK)  # bound once its interpreter imported moto: see late_port
        self.endpoint = f"http://{LOOPBACK}:{self.port}"
        env = {**os.environ, **AWS_ENV}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        wait_for_port(self.port, self.proc)
        self._buckets = 0

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=AWS_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=AWS_ENV["AWS_SECRET_ACCESS_KEY"],
        )

    def new_bucket(self) -> str:
        self._buckets += 1
        name = f"plancache-test-{self._buckets}"
        self.client().create_bucket(Bucket=name)
        return name

    @property
    def options(self) -> dict[str, object]:
        return {
            "endpoint_url": self.endpoint,
            "key": AWS_ENV["AWS_ACCESS_KEY_ID"],
            "secret": AWS_ENV["AWS_SECRET_ACCESS_KEY"],
            "client_kwargs": {"region_name": "us-east-1"},
        }

    def stop(self) -> None:
        _stop(self.proc)


class GcsEmulator:
    """``gcp-storage-emulator`` (in memory) on a free loopback port."""

    def __init__(self) -> None:
        self.port = late_port(LOOPBACK)  # bound once its interpreter started: see late_port
        self.endpoint = f"http://{LOOPBACK}:{self.port}"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gcp_storage_emulator",
                "start",
                "--host",
                LOOPBACK,
                "--port",
                str(self.port),
                "--in-memory",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, self.proc)
        self._buckets = 0

    def new_bucket(self) -> str:
        import json
        import urllib.request

        self._buckets += 1
        name = f"plancache-test-{self._buckets}"
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project=test",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=10).read()
        return name

    def stop(self) -> None:
        _stop(self.proc)


# -- misbehaving servers -----------------------------------------------------------------------


@dataclass
class FaultObject:
    body: bytes = b""
    mode: str = "ok"
    """ok | error500 | error500-once | error500-huge (500 streaming ERROR_HUGE bytes) | redirect
    (307 to ``FaultState.redirect_to``) | truncate | trickle | huge | range416 (416 to any Range)
    | early-hints (a ``103 Early Hints``, then the real answer) | length=VALUE (the body served
    with ``Content-Length: VALUE``, as given, then the connection closed) | gzip (the body, as
    given, declared ``Content-Encoding: gzip``)"""
    served: int = 0


@dataclass
class FaultState:
    objects: dict[str, FaultObject] = field(default_factory=dict)
    """key (without the bucket) -> behaviour"""
    listing: list[str] | None = None
    """keys to list instead of ``objects`` (to send hostile names)"""
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    """(method, path, Range header) of every request"""
    bytes_sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    listing_mode: str = "ok"
    """ok | error500-huge (500 streaming ERROR_HUGE bytes) | huge-page (a 200 page of 64 MiB)
    | truncated-forever (every page says there is another)"""
    synthetic: int = 0
    """list ``synthetic`` generated plans (and sidecars) under ``synthetic_prefix``, each
    served with ``synthetic_body``, without holding any of them"""
    synthetic_prefix: str = ""
    synthetic_body: bytes = b""
    redirect_to: str = ""
    signed: list[bool] = field(default_factory=list)
    """whether each GET carried an Authorization header"""
    etag: str | None = '"0"'
    """the ETag every object is served with (None: no ETag header at all)"""
    hostile_prefix: str = ""
    """a prefix whose listing never ends: every page ~3.5 MiB of keys that are not plans, each
    saying there is another; listings of the prefixes above it name it as a CommonPrefix"""
    bucket_region: str = ""
    """as S3 does for a bucket in another region: a GET signed for any other region gets
    ``301 PermanentRedirect`` with ``x-amz-bucket-region`` (and no ``Location``)"""


HUGE = 1 << 30
HOSTILE_PAGE_KEYS = 3500
ERROR_HUGE = 200 << 20
TRICKLE_PAUSE = 0.2


def synthetic_fp(i: int) -> str:
    return f"{i:016x}"


class _FaultHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: QuietHTTPServer

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _send_head(self, status: int, length: int, headers: dict[str, str] | None = None) -> None:
        """Status line and headers, declaring ``length`` bytes (a fault may then send fewer)."""
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(length))
        self.send_header("Date", formatdate(usegmt=True))
        self.end_headers()

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self._send_head(status, len(body), headers)
        self._write(body)

    def _write(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()
        with self.server.state.lock:
            self.server.state.bytes_sent += len(data)

    def _stream(self, status: int, total: int, headers: dict[str, str] | None = None) -> None:
        """Declare and send ``total`` zero bytes from one 64 KiB chunk, never holding more."""
        self._send_head(status, total, headers)
        chunk = b"\0" * 65536
        try:
            for offset in range(0, total, len(chunk)):
                self._write(chunk[: total - offset])
        except OSError:
            pass
        self.close_connection = True

    def _range(self) -> str:
        return self.headers.get("Range") or self.headers.get("x-ms-range", "")

    def do_HEAD(self) -> None:
        state = self.server.state
        with state.lock:
            state.requests.append(("HEAD", self.path, self.headers.get("Range", "")))
        self._send(405, b"")

    def do_PUT(self) -> None:
        """PutObject: the body stored as an ordinary object (chunked bodies too), recorded."""
        state = self.server.state
        key = unquote(urlparse(self.path).path).lstrip("/").split("/", 1)[-1]
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            body = b""
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers (botocore's checksums)
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with state.lock:
            state.requests.append(("PUT", self.path, ""))
            state.objects[key] = FaultObject(body)
        self._send(200, b"", {"ETag": state.etag} if state.etag else {})

    def do_DELETE(self) -> None:
        """DeleteObject: recorded and obeyed (any precondition, ``If-Match`` included, is
        ignored, as several S3-compatible servers do)."""
        state = self.server.state
        key = unquote(urlparse(self.path).path).lstrip("/").split("/", 1)[-1]
        with state.lock:
            state.requests.append(("DELETE", self.path, ""))
            state.objects.pop(key, None)
        self._send(204, b"")

    def do_GET(self) -> None:
        state = self.server.state
        with state.lock:
            state.requests.append(("GET", self.path, self._range()))
            state.signed.append("Authorization" in self.headers)
        url = urlparse(self.path)
        parts = unquote(url.path).lstrip("/").split("/", 1)
        query = parse_qs(url.query)
        if url.path.startswith("/storage/v1/b/") and state.hostile_prefix:
            return self._gcs_hostile(url.path.split("/")[4:], query)
        if query.get("restype") == ["container"] and state.hostile_prefix:
            if query.get("comp") == ["list"]:
                return self._azure_hostile(query)
            # Get Container Properties
            return self._send(
                200,
                b"",
                {
                    "ETag": '"0x1"',
                    "Last-Modified": formatdate(usegmt=True),
                    "x-ms-version": "2021-08-06",
                },
            )
        if state.redirect_to:
            self._send_head(307, 0, {"Location": f"{state.redirect_to}{self.path}"})
            return None
        if state.bucket_region and f"/{state.bucket_region}/s3/" not in self.headers.get(
            "Authorization", ""
        ):
            body = (
                b"<?xml version='1.0'?><Error><Code>PermanentRedirect</Code><Message>use the "
                b"region's "
                b"endpoint</Message></Error>"
            )
            return self._send(
                301,
                body,
                {"Content-Type": "application/xml", "x-amz-bucket-region": state.bucket_region},
            )
        if len(parts) == 1 or parts[1] == "":
            return self._list(query)
        obj = state.objects.get(parts[1])
        if obj is None and state.synthetic and parts[1].startswith(state.synthetic_prefix):
            obj = FaultObject(state.synthetic_body)
        if obj is None:
            body = (
                b"<?xml version='1.0'?><Error><Code>NoSuchKey</Code><Message>no</Message></Error>"
            )
            return self._send(404, body, {"Content-Type": "application/xml"})
        obj.served += 1
        xml = {"Content-Type": "application/xml"}
        error = (
            b"<?xml version='1.0'?><Error><Code>InternalError</Code><Message>boom</Message></Error>"
        )
        if obj.mode == "error500" or (obj.mode == "error500-once" and obj.served == 1):
            return self._send(500, error, xml)
        if obj.mode == "error500-huge":
            return self._stream(500, ERROR_HUGE, xml)
        # as S3 and GCS answer a range over an empty object
        if obj.mode == "range416" and self._range():
            return self._send(416, b"", xml)
        if obj.mode == "huge":  # ignores Range, declares and streams 1 GiB
            self.send_response(200)
            self.send_header("Content-Length", str(HUGE))
            self.end_headers()
            chunk = b"\0" * 65536
            try:
                for _ in range(HUGE // len(chunk)):
                    self._write(chunk)
            except OSError:
                pass
            return None
        body = obj.body
        rng = self._range()
        status = 200
        headers = {"Content-Type": "application/octet-stream"}
        if state.etag is not None:
            headers["ETag"] = state.etag
        if rng.startswith("bytes="):
            start_s, _, end_s = rng[6:].partition("-")
            start, end = int(start_s), min(int(end_s), len(body) - 1)
            body = body[start : end + 1]
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{len(obj.body)}"
        if obj.mode == "early-hints":  # an informational answer first: not the final one
            self.wfile.write(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n")
        if obj.mode.startswith("length="):
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", obj.mode.partition("=")[2])
            self.end_headers()
            self._write(body)
            self.close_connection = True
            return None
        if obj.mode == "truncate":
            self._send_head(status, len(body), headers)
            self._write(body[: len(body) // 2])
            self.close_connection = True
            return None
        if obj.mode == "trickle":
            self._send_head(status, len(body), headers)
            try:
                for i in range(len(body)):
                    self._write(body[i : i + 1])
                    time.sleep(TRICKLE_PAUSE)
            except OSError:
                pass
            return None
        if obj.mode == "gzip":
            headers["Content-Encoding"] = "gzip"
        return self._send(status, body, headers)

    def _list(self, query: dict[str, list[str]]) -> None:
        """ListObjectsV2 with pages (``max-keys``, ``continuation-token``: an index) and faults."""
        state = self.server.state
        bucket = unquote(urlparse(self.path).path).strip("/")
        prefix = query.get("prefix", [""])[0]
        if state.listing_mode == "error500-huge":
            return self._stream(500, ERROR_HUGE, {"Content-Type": "application/xml"})
        if state.listing_mode == "huge-page":
            return self._stream(200, 64 << 20, {"Content-Type": "application/xml"})
        if state.hostile_prefix and state.hostile_prefix.startswith(prefix):
            return self._hostile_page(bucket, prefix, query)
        if state.synthetic:
            keys: list[str] = [
                f"{state.synthetic_prefix}startup_plan_{synthetic_fp(i)}.json{suffix}"
                for i in range(state.synthetic)
                for suffix in ("", ".sig")
            ]
        else:
            keys = state.listing if state.listing is not None else sorted(state.objects)
        start = int(query.get("continuation-token", ["0"])[0])
        size = int(query.get("max-keys", ["1000"])[0])
        page = keys[start : start + size]
        more = start + size < len(keys) or state.listing_mode == "truncated-forever"
        following = f"<NextContinuationToken>{start + size}</NextContinuationToken>" if more else ""
        contents = "".join(
            f"<Contents><Key>{escape(k)}</Key><LastModified>2026-11-29T12:00:00.000Z</LastModified>"
            "<ETag>&quot;00000000000000000000000000000000&quot;</ETag><Size>"
            f"{len(state.objects.get(k, FaultObject()).body)}</Size>"
            f"<StorageClass>STANDARD</StorageClass></Contents>"
            for k in page
        )
        body = (
            "<?xml version='1.0' encoding='UTF-8'?>"
            "<ListBucketResult xmlns='http://s3.amazonaws.com/doc/2006-03-01/'>"
            f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{len(page)}</KeyCount>"
            f"<MaxKeys>{size}</MaxKeys><IsTruncated>{'true' if more else 'false'}</IsTruncated>"
            f"{following}"
            f"{contents}</ListBucketResult>"
        ).encode()
        self._send(200, body, {"Content-Type": "application/xml"})
        return None

    def _hostile_page(self, bucket: str, prefix: str, query: dict[str, list[str]]) -> None:
        """A page under ``hostile_prefix``: 3,500 keys of ~1 KB, truncated forever; above it, the
        CommonPrefix that leads there (see FaultState.hostile_prefix)."""
        state = self.server.state
        head = (
            "<?xml version='1.0' encoding='UTF-8'?><ListBucketResult xmlns='http://s3.amazonaws.com/doc/2006-03-01/'>"
            f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>"
        )
        if prefix != state.hostile_prefix:
            below = state.hostile_prefix[len(prefix) :].split("/", 1)[0]
            body = (
                f"{head}<KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>"
                f"<CommonPrefixes><Prefix>{escape(prefix + below)}/</Prefix></CommonPrefixes>"
                "</ListBucketResult>"
            )
            return self._send(200, body.encode(), {"Content-Type": "application/xml"})
        page = int(query.get("continuation-token", ["0"])[0])
        filler = "j" * 900
        contents = "".join(
            f"<Contents><Key>{escape(prefix)}{filler}-{page}-{i}</Key><Size>1</Size></Contents>"
            for i in range(HOSTILE_PAGE_KEYS)
        )
        body = (
            f"{head}<KeyCount>{HOSTILE_PAGE_KEYS}</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>true</IsTruncated>"
            f"<NextContinuationToken>{page + 1}</NextContinuationToken>"
            f"{contents}</ListBucketResult>"
        )
        return self._send(200, body.encode(), {"Content-Type": "application/xml"})

    def _gcs_hostile(self, path: list[str], query: dict[str, list[str]]) -> None:
        """GCS's JSON API for the same walk as :meth:`_hostile_page`: the bucket's metadata, and
        listings (``prefixes`` above ``hostile_prefix``, endless 3.5 MiB pages of ``items`` at
        it)."""
        import json

        state = self.server.state
        bucket = unquote(path[0])
        if len(path) == 1:
            answer: dict[str, object] = {"kind": "storage#bucket", "name": bucket}
        else:
            prefix = query.get("prefix", [""])[0]
            if prefix != state.hostile_prefix:
                below = state.hostile_prefix[len(prefix) :].split("/", 1)[0]
                answer = {"kind": "storage#objects", "prefixes": [f"{prefix}{below}/"]}
            else:
                page = int(query.get("pageToken", ["0"])[0])
                answer = {
                    "kind": "storage#objects",
                    "nextPageToken": str(page + 1),
                    "items": [
                        {"name": f"{prefix}{'j' * 900}-{page}-{i}", "size": "1"}
                        for i in range(HOSTILE_PAGE_KEYS)
                    ],
                }
        self._send(200, json.dumps(answer).encode(), {"Content-Type": "application/json"})

    def _azure_hostile(self, query: dict[str, list[str]]) -> None:
        """Azure's List Blobs for the same walk as :meth:`_hostile_page` (``BlobPrefix`` above
        ``hostile_prefix``, endless 3.5 MiB pages of blobs at it, each with a NextMarker)."""
        state = self.server.state
        prefix = query.get("prefix", [""])[0]
        head = (
            "<?xml version='1.0' encoding='utf-8'?><EnumerationResults "
            f"ServiceEndpoint='{self.server.endpoint}/' ContainerName='faulty'>"
            f"<Prefix>{escape(prefix)}</Prefix><Delimiter>/</Delimiter>"
        )
        if prefix != state.hostile_prefix:
            below = state.hostile_prefix[len(prefix) :].split("/", 1)[0]
            body = (
                f"{head}<Blobs><BlobPrefix><Name>{escape(prefix + below)}/</Name></BlobPrefix>"
                "</Blobs><NextMarker /></EnumerationResults>"
            )
        else:
            page = int(query.get("marker", ["0"])[0])
            blobs = "".join(
                f"<Blob><Name>{escape(prefix)}{'j' * 900}-{page}-{i}</Name><Properties>"
                "<Content-Length>1</Content-Length><BlobType>BlockBlob</BlobType></Properties></Blob>"
                for i in range(HOSTILE_PAGE_KEYS)
            )
            body = (
                f"{head}<Blobs>{blobs}</Blobs><NextMarker>{page + 1}</NextMarker>"
                "</EnumerationResults>"
            )
        self._send(
            200, body.encode(), {"Content-Type": "application/xml", "x-ms-version": "2021-08-06"}
        )


class QuietHTTPServer(ThreadingHTTPServer):
    """A threaded test server that stays quiet when a client hangs up on it (faults make them)."""

    daemon_threads = True
    state: Any
    endpoint: str
    """The server's own URL, where a handler needs it (set by the servers that have one)."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class LoopbackServer:
    """``handler`` served on a free loopback port from a daemon thread. ``attrs`` are set on the
    server before it serves (handlers read them as ``self.server.<name>``)."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], **attrs: Any) -> None:
        # port 0, bound and listening here at once: no late_port() needed (tests/late_ports.py)
        self.httpd = QuietHTTPServer((LOOPBACK, 0), handler)
        for name, value in attrs.items():
            setattr(self.httpd, name, value)
        self.port = int(self.httpd.server_address[1])
        self.endpoint = f"http://{LOOPBACK}:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class FaultServer(LoopbackServer):
    """An S3-shaped HTTP server on loopback whose objects misbehave as configured."""

    def __init__(self) -> None:
        super().__init__(_FaultHandler, state=FaultState())
        self.httpd.endpoint = self.endpoint

    @property
    def state(self) -> FaultState:
        return self.httpd.state

    def reset(self) -> None:
        self.httpd.state = FaultState()


class BlackHole:
    """Accepts TCP connections and never sends a byte."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind((LOOPBACK, 0))  # and listens at once: no late_port() needed
        self.sock.listen(128)
        self.port = int(self.sock.getsockname()[1])
        self.endpoint = f"http://{LOOPBACK}:{self.port}"
        self.held: list[socket.socket] = []
        self._stop = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
                self.held.append(conn)
            except OSError:
                continue

    def stop(self) -> None:
        self._stop = True
        self.thread.join(2)
        for conn in self.held:
            conn.close()
        self.sock.close()


# -- pytest fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GcsEmulator]:
    server = GcsEmulator()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    from azurite_server import Azurite, azurite_binary

    binary = azurite_binary()
    if binary is None:
        pytest.skip(
            "Azurite not installed: scripts/bootstrap-test-env.sh installs it into .test-tools/ "
            "with npm"
        )
    server = Azurite(binary)
    yield server
    server.stop()


def _registry(**shape: Any) -> DockerRegistry:
    from registry_server import DockerRegistry, registry_binary

    binary = registry_binary()
    if binary is None:
        pytest.skip(
            "docker-registry not installed: scripts/bootstrap-test-env.sh installs it with apt"
        )
    return DockerRegistry(binary, **shape)


@pytest.fixture(scope="session")
def registry() -> Iterator[DockerRegistry]:
    """Debian's docker-registry on loopback, plain HTTP, anonymous (tests/registry_server.py)."""
    server = _registry()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tls_registry() -> Iterator[DockerRegistry]:
    """The same with TLS (a self-signed certificate, ``.ca``) and htpasswd basic auth."""
    server = _registry(tls=True, auth=True)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def fault_server_session() -> Iterator[FaultServer]:
    server = FaultServer()
    yield server
    server.stop()


@pytest.fixture
def fault_server(fault_server_session: FaultServer) -> FaultServer:
    fault_server_session.reset()
    return fault_server_session


@pytest.fixture(scope="session")
def black_hole() -> Iterator[BlackHole]:
    hole = BlackHole()
    yield hole
    hole.stop()


S3_PATH_ENV = "PLANCACHE_TEST_S3_PATH"
"""Read by store_probe.py: ``s3fs`` makes a probe in a child process read through s3fs."""


@pytest.fixture(params=["direct", "s3fs"])
def s3_read_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each S3 read case on both read paths: plain botocore (a boot's few fingerprints on a
    store whose s3fs filesystem is not built, the default) and s3fs (bulk reads)."""
    if request.param == "s3fs":
        from plancache.storage import store

        monkeypatch.setattr(store, "MAX_FINGERPRINTS", 0)
        monkeypatch.setenv(S3_PATH_ENV, "s3fs")
    return str(request.param)


# -- one signed plan on the fault server, pulled through the CLI -----------------------------------


def serve_signed(
    server: FaultServer, keys: Path, mode: str = "ok", sig_mode: str = "ok", *, prefix: str
) -> None:
    """The fault server serves a plan for conftest's FP and its signature by ``keys`` under
    ``prefix`` (S3: ``<prefix>/<name>``; Azure: ``<container>/<prefix>/<name>``), each object
    misbehaving as its mode says."""
    from conftest import FP, plan_bytes
    from plancache.keys.schemes import load_signer
    from plancache.pipeline.resolver import utcnow
    from plancache.trust.plans.plan import plan_name, sig_name
    from plancache.trust.signing import sign_plan

    data = plan_bytes()
    sig = sign_plan(plan_name(FP), data, load_signer(str(keys)), utcnow())
    server.state.objects[f"{prefix}/{plan_name(FP)}"] = FaultObject(data, mode)
    server.state.objects[f"{prefix}/{sig_name(FP)}"] = FaultObject(sig, sig_mode)


def pull_fingerprint(
    capsys: pytest.CaptureFixture[str],
    url: str,
    storage_option: str,
    keys: Path,
    dest: Path,
    *extra: str,
) -> tuple[int, str, str, float]:
    """``plancache pull --fingerprint FP`` in this process: exit code, stdout, stderr, seconds."""
    from conftest import FP
    from plancache.cli.main import main

    started = time.monotonic()
    code = main(
        [
            "pull",
            "--trusted-keys",
            f"{keys}.pub",
            "--fingerprint",
            FP,
            "--storage-option",
            storage_option,
            *extra,
            url,
            str(dest),
        ]
    )
    elapsed = time.monotonic() - started
    out, err = capsys.readouterr()
    return code, out, err, elapsed


def nothing_written(dest: Path) -> bool:
    return not dest.exists() or list(dest.iterdir()) == []
