"""PoC 1: a bearer token minted with the node's credentials goes in clear to a registry off
loopback spoken to in plain HTTP (plain_http=true).

Tried: in a network namespace of its own (unshare -rn; 10.9.9.9 on its lo), a registry at
10.9.9.9 spoken to in plain HTTP (plain_http=true, as an operator with an in-cluster HTTP
registry sets it) whose 401 names a TLS token realm on its own host (https://10.9.9.9:PORT,
trusted through SSL_CERT_FILE). The docker config holds basic credentials for the registry.
SECURITY.md: "basic credentials and identity tokens go only over TLS or to loopback, whatever
plain_http says"; a Basic challenge from the same registry is refused ("asks for a password over
plain HTTP: not sent"). The bearer challenge is not: the credentials go to the realm (TLS: fine),
and the token they buy (scope pull,push[,delete]) is then sent in clear to 10.9.9.9 on every
request, replayable by anyone on the path for its lifetime.

Run: PYTHONPATH=src:tests python redteam/poc_bearer_over_plain_http.py
(re-executes itself under unshare -rn). Prints what the registry received in clear.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import ssl
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

AUTH = base64.b64encode(b"ci:not-a-real-secret-4711").decode()
ADDRESS = "10.9.9.9"


def certificate(directory: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "poc realm")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ADDRESS))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class TokenService(BaseHTTPRequestHandler):
    """A TLS token service: Basic AUTH (or a refresh_token grant) buys 'stub-token'."""

    seen: list[str] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization", ""))
        ok = self.headers.get("Authorization") == f"Basic {AUTH}"
        self._answer(ok)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        self.seen.append(body)
        self._answer("refresh_token=refresh-4711" in body)

    def _answer(self, ok: bool) -> None:
        body = json.dumps({"token": "stub-token", "expires_in": 300}).encode() if ok else b"{}"
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def child() -> None:
    for argv in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", f"{ADDRESS}/32", "dev", "lo"]):
        subprocess.run(argv, check=True)
    home = Path(tempfile.mkdtemp())
    cert, key = certificate(home)
    os.environ["SSL_CERT_FILE"] = str(cert)  # the realm's TLS is trusted, as a public CA would be
    server = HTTPServer((ADDRESS, 0), TokenService)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    realm = f"https://{ADDRESS}:{server.server_address[1]}/token"

    from registry_stub import RegistryStub

    from plancache.storage.store import open_store

    registry = RegistryStub(address=ADDRESS)
    registry.state.bearer = AUTH
    registry.state.realm = realm
    os.environ["DOCKER_CONFIG"] = str(home)
    outcome: dict[str, object] = {}
    for case, entry in (("basic-auth", {"auth": AUTH}), ("identity-token", {"identitytoken": "refresh-4711"})):
        registry.state.requests.clear()
        (home / "config.json").write_text(json.dumps({"auths": {registry.host: {**entry}}}))
        store = open_store(registry.url("team/plans"), {"plain_http": True}, timeout=10)
        result = store.fetch("0123456789abcdef")
        clear = sorted(
            {h.get("Authorization", "") for _, _, h in registry.state.requests if h.get("Authorization")}
        )
        outcome[case] = {
            "fetch": result.error.detail if result.error else "ok (no error)",
            "sent_in_clear_to_10.9.9.9": clear,
        }
    outcome["realm_received"] = ["<basic creds>" if s == f"Basic {AUTH}" else ("<refresh grant>" if "refresh-4711" in s else s) for s in TokenService.seen]
    print(json.dumps(outcome, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child()
    else:
        sys.exit(subprocess.call(["unshare", "-rn", sys.executable, __file__, "child"]))
