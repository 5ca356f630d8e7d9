"""PoC 6 (held): CA files and credential helpers as an attacker (or a typo) shapes them.

Tried, each against a loopback registry stub that wants a login:
* ca_file = a symlink to a FIFO, /dev/zero, a directory, a 5 MiB file; a hosts.toml `ca` the same;
* credsStore = "../../tmp/x" (path separators), "x y";
* a helper that exits 1 with the secret on stderr and on stdout; one that answers valid JSON
  without a newline; one that answers {"Username": "<token>", ...} (an identity token);
* every outcome's text checked for the password, the identity token and the issued token.
Run: PYTHONPATH=src:tests python redteam/poc_files_and_helpers.py
"""

from __future__ import annotations

import base64
import json
import os
import stat
import tempfile
import threading
import time
from pathlib import Path

from registry_stub import RegistryStub

from plancache.storage.store import open_store
from plancache.trust.errors import PlanCacheError

SECRET = "not-a-real-secret-4711"
AUTH = base64.b64encode(f"ci:{SECRET}".encode()).decode()
home = Path(tempfile.mkdtemp())
os.environ["DOCKER_CONFIG"] = str(home)
registry = RegistryStub()
registry.state.bearer = AUTH
out: dict[str, str] = {}


def attempt(name: str, options: dict[str, object]) -> None:
    result: list[str] = []

    def go() -> None:
        try:
            error = open_store(registry.url("team/plans"), options, timeout=10).fetch("0123456789abcdef").error
            result.append(f"{error.reason.value}: {error.detail}" if error else "ok")
        except PlanCacheError as exc:
            result.append(f"{exc.reason.value}: {exc.detail}")

    started = time.monotonic()
    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    thread.join(30)
    text = result[0] if result else "HUNG"
    leaked = any(s in text for s in (SECRET, AUTH, "refresh-4711", "stub-token"))
    out[name] = f"[{time.monotonic() - started:.1f}s{' LEAK' if leaked else ''}] {text[:150]}"


fifo = home / "fifo"
os.mkfifo(fifo)
(home / "link").symlink_to(fifo)
(home / "big.pem").write_bytes(b"x" * (5 * 1024 * 1024))
for name, path in (("ca symlink->fifo", home / "link"), ("ca /dev/zero", Path("/dev/zero")),
                   ("ca directory", home), ("ca 5 MiB", home / "big.pem")):
    attempt(name, {"ca_file": str(path)})
hosts = home / "certs.d" / registry.host / "hosts.toml"
hosts.parent.mkdir(parents=True)
for name, ca in (("hosts.toml ca /dev/zero", "/dev/zero"), ("hosts.toml ca symlink->fifo", str(home / "link"))):
    hosts.write_text(f'[host."https://mirror.example"]\n  ca = "{ca}"\n')
    attempt(name, {"mirror_config": str(hosts)})

bindir = home / "bin"
bindir.mkdir()
os.environ["PATH"] = f"{bindir}{os.pathsep}{os.environ['PATH']}"


def helper(name: str, body: str) -> None:
    program = bindir / f"docker-credential-{name}"
    program.write_text("#!/bin/sh\n" + body)
    program.chmod(program.stat().st_mode | stat.S_IXUSR)


for store in ("../../tmp/x", "x y", "/bin/sh"):
    (home / "config.json").write_text(json.dumps({"credsStore": store}))
    attempt(f"credsStore {store!r}", {})
helper("fails", f"echo '{SECRET}' >&2\necho '{{\"Secret\": \"{SECRET}\"}}'\nexit 1\n")
helper("nonl", f"printf '{{\"Username\": \"ci\", \"Secret\": \"{SECRET}\"}}'\n")
helper("idtok", "printf '{\"Username\": \"<token>\", \"Secret\": \"refresh-4711\"}'\n")
for name in ("fails", "nonl", "idtok"):
    (home / "config.json").write_text(json.dumps({"credsStore": name}))
    attempt(f"helper {name}", {})
print(json.dumps(out, indent=1))
