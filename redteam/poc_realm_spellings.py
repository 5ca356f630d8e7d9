"""PoC 4 (held): realm spellings that try to pass for the registry's own host, and redirects.

Tried: a registry on 127.0.0.1 (tests/registry_stub.py) with basic credentials in the docker
config, whose 401 names a realm served by a second stub on 127.0.0.2 (the "other host"),
spelled: userinfo (`http://127.0.0.1:P@127.0.0.2:Q/`), backslash-userinfo, percent-encoded
host, trailing dot, case, IPv4-mapped IPv6 literal, fragment/query tricks, a `Basic` challenge
listed after the Bearer one, two realm parameters; and a token endpoint on the registry's own
host that redirects (307) to the other host. Also: a realm on the registry's host but another
port (allowed by design: the rule is by host).
Expected: the other host receives no credential in any case.
Run: PYTHONPATH=src:tests python redteam/poc_realm_spellings.py
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from http.server import BaseHTTPRequestHandler, HTTPServer
import threading
from pathlib import Path

from registry_stub import RegistryStub

from plancache.storage.store import open_store

AUTH = base64.b64encode(b"ci:not-a-real-secret-4711").decode()
home = Path(tempfile.mkdtemp())
os.environ["DOCKER_CONFIG"] = str(home)
registry, other = RegistryStub(), RegistryStub(address="127.0.0.2")
registry.state.bearer = other.state.bearer = AUTH
(home / "config.json").write_text(json.dumps({"auths": {registry.host: {"auth": AUTH}}}))
o = other.host
op = other.port
cases = {
    "userinfo": f"http://{registry.host}@{o}/token",
    "backslash-userinfo": f"http://{registry.host}\\@{o}/token",
    "percent-host": f"http://127.0.0.%32:{op}/token",
    "trailing-dot": f"http://127.0.0.2.:{op}/token",
    "mapped-v6": f"http://[::ffff:127.0.0.2]:{op}/token",
    "fragment": f"http://{o}/token#{registry.host}",
    "query": f"http://{o}/token?{registry.host}",
    "tab-in-host": f"http://127.0.0.1\t.0.0.2:{op}/token",
}
out = {}


class Redirect(BaseHTTPRequestHandler):
    def log_message(self, *a: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(307)
        self.send_header("Location", f"http://{o}/token")
        self.send_header("Content-Length", "0")
        self.end_headers()


redirector = HTTPServer(("127.0.0.1", 0), Redirect)
threading.Thread(target=redirector.serve_forever, daemon=True).start()
cases["token-endpoint-redirects"] = f"http://127.0.0.1:{redirector.server_address[1]}/token"
for name, realm in cases.items():
    other.state.requests.clear()
    registry.state.realm = realm
    error = open_store(registry.url("team/plans"), timeout=10).fetch("0123456789abcdef").error
    leaked = [h.get("Authorization") for _, _, h in other.state.requests if h.get("Authorization")]
    out[name] = {"other host got": leaked, "outcome": (error.reason.value + ": " + error.detail[:110]) if error else "ok"}
# same host, another port: by design the credentials go there (the rule is by host)
same = RegistryStub()
same.state.bearer = AUTH
registry.state.realm = f"http://{same.host}/token"
error = open_store(registry.url("team/plans"), timeout=10).fetch("0123456789abcdef").error
out["same-host-other-port"] = {"that port got": [h.get("Authorization") == f"Basic {AUTH}" for _, p, h in same.state.requests], "outcome": error.detail if error else "ok"}
print(json.dumps(out, indent=1))
