"""A small in-memory OCI registry on 127.0.0.1 for what docker-registry cannot be made to do.

Two uses only (everything else is tested against Debian's docker-registry): the **native
referrers API** (``GET /v2/<name>/referrers/<digest>``, ``OCI-Subject`` on a manifest PUT with
a subject), which no registry installable here serves; and **misbehaviour on demand**: a
manifest answered with other bytes than its digest, a wrong media type, an oversized or
endless body, a blob of other bytes, a redirect to another host. ``faults`` maps a path
suffix to a mode; every request is recorded in ``requests`` (method, path, headers).
"""

from __future__ import annotations

import hashlib
import json
import re
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from store_servers import LOOPBACK, QuietHTTPServer

INDEX = "application/vnd.oci.image.index.v1+json"
DENIED = (
    b'{"errors": [{"code": "DENIED", "message": "requested access to the resource is denied"}]}'
)


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class StubState:
    def __init__(self, referrers_api: bool) -> None:
        self.referrers_api = referrers_api
        self.manifests: dict[str, tuple[bytes, str]] = {}  # digest -> (bytes, media type)
        self.tags: dict[str, str] = {}
        self.blobs: dict[str, bytes] = {}
        self.faults: dict[str, str] = {}
        self.redirect_to: str = ""
        self.bearer: str | None = None
        """When set, the Basic credentials (``user:password``, base64) the token service wants;
        ``""``: anonymous tokens. Every /v2/ request then needs ``Bearer stub-token``."""
        self.refresh_token: str | None = None
        """When set, the token service wants an OAuth2 ``refresh_token`` grant (a POST, as for
        docker's ``identitytoken``) carrying this token instead of Basic credentials."""
        self.token_forms: list[dict[str, str]] = []
        self.realm: str | None = None
        """When set, the token realm the challenge names instead of the stub's own ``/token``
        (another host, plain HTTP, or a hostile one)."""
        self.issued_token = "stub-token"
        """What the token service hands out; anything but ``stub-token`` is refused by the
        registry (a token service handing out useless tokens: 401 forever)."""
        self.missing_status = 404
        """The answer to a manifest read of a tag or digest the registry does not hold: 403 as a
        least-privilege registry answers (ECR, GAR with pull-only scope), with a ``DENIED``
        error body."""
        self.endless_tags = False
        """When set, ``tags/list`` answers 1000 new plan tags after ``last`` and a ``Link`` to
        the next page, forever (a registry that never ends its listing)."""
        self.tag_pages = 0
        self.tags_body: bytes | None = None
        """When set, every ``tags/list`` answer is these bytes (a malformed tag list)."""
        """``tags/list`` pages answered."""
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, *args: Any) -> None:
        pass

    @property
    def state(self) -> StubState:
        return self.server.state

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _fault(self) -> str:
        for suffix, mode in self.state.faults.items():
            if self.path.split("?")[0].endswith(suffix):
                return mode
        return ""

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length)

    def _route(self) -> None:
        self.state.requests.append((self.command, self.path, dict(self.headers)))
        mode = self._fault()
        if mode == "black-hole":
            time.sleep(3600)
        path = self.path.split("?")[0]
        if path == "/token":
            return self._token()
        if (
            self.state.bearer is not None
            and self.headers.get("Authorization") != "Bearer stub-token"
        ):
            own = f"http://{self.server.server_address[0]}:{self.server.server_address[1]}/token"
            realm = self.state.realm or own
            challenge = f'Bearer realm="{realm}",service="stub",scope="repository:x:pull"'
            return self._send(401, b"{}", {"WWW-Authenticate": challenge})
        if path == "/v2/":
            return self._send(200, b"{}")
        match = re.fullmatch(r"/v2/(.+)/(manifests|blobs|referrers|tags)/(.*)", path)
        if match is None:
            return self._send(404)
        _, what, ref = match.groups()
        if what == "manifests":
            return self._manifest(ref, mode)
        if what == "blobs":
            return self._blob(ref, mode)
        if what == "referrers" and self.state.referrers_api:
            return self._referrers(ref)
        if what == "tags":
            self.state.tag_pages += 1
            if self.state.endless_tags:
                return self._endless_tags()
            if self.state.tags_body is not None:
                return self._send(200, self.state.tags_body, {"Content-Type": "application/json"})
            tags = json.dumps({"tags": sorted(self.state.tags)}).encode()
            return self._send(200, tags, {"Content-Type": "application/json"})
        return self._send(404)

    def _token(self) -> None:
        state = self.state
        if state.refresh_token is not None:
            form = dict(parse_qsl(self._body().decode())) if self.command == "POST" else {}
            state.token_forms.append(form)
            if form.get("grant_type") != "refresh_token" or (
                form.get("refresh_token") != state.refresh_token
            ):
                self._send(401, b'{"error": "invalid_grant"}')
                return
            answer = {"access_token": state.issued_token, "expires_in": 300}
            self._send(200, json.dumps(answer).encode())
            return
        wanted = state.bearer
        given = self.headers.get("Authorization", "")
        if wanted and given != f"Basic {wanted}":
            self._send(401, b"{}")
            return
        self._send(200, json.dumps({"token": state.issued_token, "expires_in": 300}).encode())

    def _manifest(self, ref: str, mode: str) -> None:
        state = self.state
        if self.command == "PUT":
            body = self._body()
            digest = digest_of(body)
            media = self.headers.get("Content-Type", "")
            with state.lock:
                state.manifests[digest] = (body, media)
                if not ref.startswith("sha256:"):
                    state.tags[ref] = digest
            headers = {"Docker-Content-Digest": digest, "Location": f"/v2/x/manifests/{digest}"}
            subject = json.loads(body).get("subject")
            if state.referrers_api and subject:
                headers["OCI-Subject"] = subject["digest"]
            return self._send(201, b"", headers)
        digest = ref if ref.startswith("sha256:") else state.tags.get(ref, "")
        if self.command == "DELETE":
            with state.lock:
                found = state.manifests.pop(digest, None)
                for tag in [t for t, d in state.tags.items() if d == digest]:
                    del state.tags[tag]
            return self._send(202 if found else 404)
        if digest not in state.manifests:
            if state.missing_status == 403:
                return self._send(403, DENIED, {"Content-Type": "application/json"})
            return self._send(state.missing_status)
        body, media = state.manifests[digest]
        headers = {"Content-Type": media, "Docker-Content-Digest": digest}
        if mode == "other-bytes":
            body = body.replace(b'"size":', b'"size": ', 1)
        elif mode == "wrong-type":
            headers["Content-Type"] = "application/vnd.docker.distribution.manifest.v2+json"
        elif mode == "oversized":
            headers["Content-Length"] = str(64 * 1024 * 1024)
        elif mode == "endless":
            return self._endless(headers)
        return self._send(200, body, headers)

    def _endless(self, headers: dict[str, str]) -> None:
        self.send_response(200)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = b"x" * 65536
        try:
            while True:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            return

    def _endless_tags(self) -> None:
        query = dict(parse_qsl(self.path.partition("?")[2]))
        last = query.get("last", "")
        start = int(last[len("startup_plan_") : -len(".json")], 16) + 1 if last else 0
        tags = [f"startup_plan_{i:016x}.json" for i in range(start, start + 1000)]
        link = f'</v2/x/tags/list?n=1000&last={tags[-1]}>; rel="next"'
        body = json.dumps({"name": "x", "tags": tags}).encode()
        self._send(200, body, {"Content-Type": "application/json", "Link": link})

    def _blob(self, ref: str, mode: str) -> None:
        state = self.state
        if self.command == "POST":
            return self._send(202, b"", {"Location": "/v2/x/blobs/uploads/u1"})
        if self.command == "PUT":
            body = self._body()
            digest = self.path.split("digest=", 1)[1]
            state.blobs[digest] = body
            return self._send(201, b"", {"Docker-Content-Digest": digest})
        if ref not in state.blobs:
            return self._send(404)
        if mode == "redirect":
            return self._send(307, b"", {"Location": f"{state.redirect_to}/{ref}"})
        body = state.blobs[ref]
        if mode == "other-bytes":
            body = bytes(len(body))
        return self._send(200, body, {"Content-Type": "application/octet-stream"})

    def _referrers(self, digest: str) -> None:
        entries = []
        for d, (body, media) in list(self.state.manifests.items()):
            doc = json.loads(body)
            if (doc.get("subject") or {}).get("digest") == digest:
                entry = {"mediaType": media, "digest": d, "size": len(body)}
                for key in ("artifactType", "annotations"):
                    if key in doc:
                        entry[key] = doc[key]
                entries.append(entry)
        index = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": entries})
        self._send(200, index.encode(), {"Content-Type": INDEX})

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _route


class RegistryStub:
    """The stub on a free loopback port (see the module docstring)."""

    def __init__(
        self,
        referrers_api: bool = True,
        address: str = LOOPBACK,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        """``tls``: (certificate, key) to speak TLS with (a token service's realm over https)."""
        self.server = QuietHTTPServer((address, 0), _Handler)
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.server.daemon_threads = True
        self.server.state = StubState(referrers_api)
        self.port = self.server.server_address[1]
        self.host = f"{address}:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def state(self) -> StubState:
        return self.server.state

    def url(self, repository: str) -> str:
        return f"oci://{self.host}/{repository}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def stub() -> Iterator[RegistryStub]:
    server = RegistryStub()
    yield server
    server.stop()
