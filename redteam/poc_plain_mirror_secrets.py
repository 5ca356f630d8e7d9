"""PoC 7: a plain-HTTP mirror off loopback (containerd hosts.toml `http://10.9.9.10:P`) and
secrets: the mirror's own credentials (docker config keyed by the mirror's host) and the
registry's (keyed by the registry's host).

Tried, in a network namespace of its own (10.9.9.9 the registry, TLS; 10.9.9.10 the mirror,
plain HTTP as its hosts.toml says):
* the mirror answers 401 Basic: are the mirror's credentials sent in clear? (held before too)
* the mirror answers 401 Bearer with a TLS realm on its own host: is the token the mirror's
  credentials buy sent to it in clear? (the finding of PoC 1, fixed in 81bdd73)
* the mirror answers 401 Bearer naming the *registry's* realm (https://10.9.9.9/token), asking
  for the registry's credentials: are they sent? (held: the mirror's session looks up the
  mirror's host only)
Run: PYTHONPATH=src:tests python redteam/poc_plain_mirror_secrets.py
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MIRROR_AUTH = base64.b64encode(b"mirror:mirror-secret-1").decode()
ORIGIN_AUTH = base64.b64encode(b"origin:origin-secret-2").decode()


def child() -> None:
    for argv in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", "10.9.9.9/32", "dev", "lo"],
                 ["ip", "addr", "add", "10.9.9.10/32", "dev", "lo"]):
        subprocess.run(argv, check=True)
    from registry_stub import RegistryStub, _Handler
    from store_servers import self_signed

    from plancache.storage.store import open_store

    home = Path(tempfile.mkdtemp())
    tls = self_signed(home, "origin", "10.9.9.9")
    os.environ["SSL_CERT_FILE"] = str(tls[0])
    os.environ["DOCKER_CONFIG"] = str(home)
    origin = RegistryStub(address="10.9.9.9", tls=tls)
    origin.state.bearer = ORIGIN_AUTH
    mirror = RegistryStub(address="10.9.9.10")
    realm_on_mirror = RegistryStub(address="10.9.9.10", tls=self_signed(home, "mirror", "10.9.9.10"))
    os.environ["SSL_CERT_FILE"] = str(home / "bundle.pem")
    (home / "bundle.pem").write_bytes(tls[0].read_bytes() + (home / "mirror-cert.pem").read_bytes())
    (home / "config.json").write_text(json.dumps({"auths": {
        origin.host: {"auth": ORIGIN_AUTH}, mirror.host: {"auth": MIRROR_AUTH}}}))
    host, port = origin.host.rsplit(":", 1)
    hosts = home / "certs.d" / f"{host}_{port}_" / "hosts.toml"
    hosts.parent.mkdir(parents=True)
    hosts.write_text(f'[host."http://{mirror.host}"]\n')
    outcome = {}
    basic = {"n": 0}
    original = _Handler._route

    def basic_route(self):  # the mirror asks for a password (Basic), as a plain registry may
        if self.server.server_address[0] == "10.9.9.10" and basic["n"] and self.headers.get("Authorization") is None:
            self.state.requests.append((self.command, self.path, dict(self.headers)))
            return self._send(401, b"{}", {"WWW-Authenticate": 'Basic realm="mirror"'})
        return original(self)

    _Handler._route = _Handler.do_GET = _Handler.do_HEAD = basic_route
    for case in ("basic", "bearer-own-realm", "bearer-origin-realm"):
        basic["n"] = case == "basic"
        mirror.state.bearer = None if case == "basic" else MIRROR_AUTH
        realm_on_mirror.state.bearer = MIRROR_AUTH
        mirror.state.realm = {
            "bearer-own-realm": f"https://{realm_on_mirror.host}/token",
            "bearer-origin-realm": f"https://{origin.host}/token",
        }.get(case)
        for server in (origin, mirror, realm_on_mirror):
            server.state.requests.clear()
        error = open_store(f"oci://{origin.host}/team/plans", {"mirror_config": str(hosts)}, timeout=10).fetch("0123456789abcdef").error
        seen = {
            name: sorted({h.get("Authorization", "") for _, _, h in s.state.requests} - {""})
            for name, s in (("origin", origin), ("mirror (plain)", mirror), ("realm on mirror host", realm_on_mirror))
        }
        outcome[case] = {"outcome": (error.reason.value + ": " + error.detail[:140]) if error else "ok", "authorization seen": seen}
    print(json.dumps(outcome, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child()
    else:
        sys.exit(subprocess.call(["unshare", "-rn", sys.executable, __file__, "child"]))
