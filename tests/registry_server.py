"""Debian's ``docker-registry`` (CNCF distribution 2.8) on 127.0.0.1, for the OCI store tests.

Installed with apt by scripts/bootstrap-test-env.sh; started here on a free loopback port with
its storage in a temporary directory and deletes enabled, in one of three shapes:

* plain HTTP (loopback only: plancache allows plain HTTP there without an option);
* TLS with a self-signed certificate for ``IP:127.0.0.1`` (the custom CA the tests pass) and
  basic auth from an htpasswd file (bcrypt, made with the ``bcrypt`` package plancache already
  needs, so no apache2-utils);
* a pull-through mirror (``proxy.remoteurl``) in front of another one.

Every request the registry answers is in its log (``response completed`` lines, one per
request, with ``http.request.method`` and ``http.request.uri``): :meth:`DockerRegistry.requests`
counts them, which is how the mirror tests count what reached the origin.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from late_ports import late_port
from store_servers import LOOPBACK, _stop, self_signed, wait_for_port

BINARY = "docker-registry"
OCI_TYPES = "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json"
USER = "plancache-ci"
PASSWORD = "not-a-real-secret-4711"  # a throwaway test credential


def registry_binary() -> str | None:
    """``$DOCKER_REGISTRY_BIN``, else Debian's ``docker-registry`` on PATH."""
    return os.environ.get("DOCKER_REGISTRY_BIN") or shutil.which(BINARY)


class DockerRegistry:
    """One ``docker-registry serve`` on a free loopback port (see the module docstring)."""

    def __init__(
        self, binary: str, *, tls: bool = False, auth: bool = False, remote: str | None = None
    ) -> None:
        import bcrypt

        self.dir = Path(tempfile.mkdtemp(prefix="plancache-registry-"))
        self.port = late_port(LOOPBACK)  # bound once the Go binary read its config: see late_port
        self.host = f"{LOOPBACK}:{self.port}"
        self.log = self.dir / "registry.log"
        self.ca: Path | None = None
        lines = [
            "version: 0.1",
            "log: {level: info, formatter: json, accesslog: {disabled: true}}",
            f"storage: {{filesystem: {{rootdirectory: {self.dir / 'data'}}}, "
            "delete: {enabled: true}, cache: {blobdescriptor: inmemory}}",
        ]
        http = f"addr: {self.host}, secret: plancache-test-secret"
        if tls:
            cert, key = self_signed(self.dir, "registry")
            self.ca = cert
            http += f", tls: {{certificate: {cert}, key: {key}}}"
        lines.append(f"http: {{{http}}}")
        if auth:
            hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
            (self.dir / "htpasswd").write_text(f"{USER}:{hashed}\n")
            lines.append(
                f"auth: {{htpasswd: {{realm: plancache-test, path: {self.dir / 'htpasswd'}}}}}"
            )
        if remote is not None:
            lines.append(f"proxy: {{remoteurl: {remote}}}")
        config = self.dir / "config.yml"
        config.write_text("\n".join(lines) + "\n")
        self.scheme = "https" if tls else "http"
        self.endpoint = f"{self.scheme}://{self.host}"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
            )
        wait_for_port(self.port, self.proc, timeout=30)
        self._repos = 0
        self._settled = 0

    def url(self, repository: str) -> str:
        """The plancache store URL of ``repository`` on this registry."""
        return f"oci://{self.host}/{repository}"

    def new_repository(self, stem: str = "plans") -> str:
        self._repos += 1
        return f"plancache/{stem}-{self._repos}"

    def requests(self, pattern: str = "") -> list[tuple[str, str]]:
        """(method, uri) of every request answered so far whose URI matches ``pattern``."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if "response completed" not in line:
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            method, uri = entry.get("http.request.method"), entry.get("http.request.uri", "")
            if isinstance(method, str) and re.search(pattern, uri):
                out.append((method, uri))
        return out

    def wait_logged(self, count: int, pattern: str = "", timeout: float = 5.0) -> None:
        """Until at least ``count`` requests matching ``pattern`` are in the log (it is written
        after the answer)."""
        end = time.monotonic() + timeout
        while len(self.requests(pattern)) < count and time.monotonic() < end:
            time.sleep(0.02)

    def settled_requests(self, pattern: str = "") -> list[tuple[str, str]]:
        """:meth:`requests`, once everything answered before this call is in the log: a
        request of the test's own (``GET /v2/?settled=N``), answered after them, is logged."""
        self._settled += 1
        marker = f"settled={self._settled}"
        self.get(f"/v2/?{marker}")
        self.wait_logged(1, re.escape(marker), timeout=30)
        return self.requests(pattern)

    def get(self, path: str, accept: str = OCI_TYPES) -> tuple[int, bytes]:
        """A plain GET on the plain-HTTP registry (tests inspect what plancache stored)."""
        request = urllib.request.Request(f"{self.endpoint}{path}", headers={"Accept": accept})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def stop(self) -> None:
        _stop(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)
