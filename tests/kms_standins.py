"""Local stand-ins for AWS KMS and Google Cloud KMS that speak each service's real wire protocol,
backed by real Ed25519 keys, for the awskms:// and gcpkms:// signer tests.

Cloud KMS cannot be reached from here and moto has no Ed25519 keys, so these answer what the
services document (checked against botocore's service model for KMS, ``kms/2014-11-01``, and
google-cloud-kms's REST transport): the SDKs under test are the real boto3 and
google-cloud-kms, sending real requests (SigV4-signed, OAuth-bearer) over real sockets.

* :class:`AwsKms`: the JSON 1.1 protocol: ``POST /`` with ``X-Amz-Target: TrentService.Sign`` or
  ``TrentService.GetPublicKey``, base64 blobs, errors as ``{"__type": …, "message": …}`` with
  HTTP 400 (``AccessDeniedException``, ``NotFoundException``, ``ValidationException``). Serves
  HTTPS with a self-signed certificate when asked (for ``awskms://HOST:PORT/…``).
* :class:`GcpKms`: ``GET /v1/{name}/publicKey``, ``POST /v1/{name}:asymmetricSign``. Callers
  authenticate as a service account whose key file :meth:`GcpKms.service_account` writes:
  google-auth sends a self-signed JWT (RS256) as the bearer token, which the stand-in
  verifies with that account's public key, or trades a JWT for a token at ``/token``.

Both record every request and can hang (``hang = True``) to test budgets. Loopback only.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from store_servers import LOOPBACK

ACCOUNT = "111122223333"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _spki_der(key: Any) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@dataclass
class Served:
    """A running server: its endpoint, its recorded requests, and a switch to hang."""

    httpd: ThreadingHTTPServer
    endpoint: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    hang: bool = False

    def stop(self) -> None:
        self.hang = False
        self.httpd.shutdown()
        self.httpd.server_close()


class _StandInServer(ThreadingHTTPServer):
    """A stand-in's server: its state, for the handlers, and quiet when a client gives up."""

    daemon_threads = True
    state: Any

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up (a budget's end): nothing to report."""


def _serve(
    handler: type[BaseHTTPRequestHandler], state: Any, tls: tuple[Path, Path] | None = None
) -> ThreadingHTTPServer:
    httpd = _StandInServer((LOOPBACK, 0), handler)
    httpd.state = state
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(tls[0]), str(tls[1]))
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


# -- AWS KMS ---------------------------------------------------------------------------------------


@dataclass
class AwsKey:
    key_id: str
    private: Any
    spec: str = "ECC_NIST_EDWARDS25519"
    usage: str = "SIGN_VERIFY"
    aliases: tuple[str, ...] = ()
    denied: bool = False

    @property
    def arn(self) -> str:
        return f"arn:aws:kms:us-east-1:{ACCOUNT}:key/{self.key_id}"


class AwsKms(Served):
    """The KMS JSON protocol over one or more keys (see the module docstring)."""

    def __init__(self, keys: list[AwsKey], tls: tuple[Path, Path] | None = None) -> None:
        self.keys = keys
        httpd = _serve(_AwsHandler, self, tls)
        scheme = "https" if tls else "http"
        super().__init__(httpd, f"{scheme}://{LOOPBACK}:{httpd.server_address[1]}")

    def find(self, ref: str) -> AwsKey | None:
        for key in self.keys:
            if ref in (
                key.key_id,
                key.arn,
                *key.aliases,
                *(f"arn:aws:kms:us-east-1:{ACCOUNT}:{a}" for a in key.aliases),
            ):
                return key
        return None


class _AwsHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, kind: str, message: str) -> None:
        self._reply(400, {"__type": kind, "message": message})

    def do_POST(self) -> None:
        state: AwsKms = self.server.state  # type: ignore[attr-defined]  # a _StandInServer's
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        target = self.headers.get("X-Amz-Target", "")
        auth = self.headers.get("Authorization", "")
        state.requests.append({"target": target, "body": body, "authorization": auth})
        while state.hang:
            time.sleep(0.05)
        if not auth.startswith("AWS4-HMAC-SHA256 Credential="):
            return self._error("MissingAuthenticationTokenException", "request is not SigV4-signed")
        if self.headers.get("Content-Type") != "application/x-amz-json-1.1":
            return self._error("SerializationException", "wrong content type")
        key = state.find(body.get("KeyId", ""))
        if key is None:
            return self._error("NotFoundException", f"Key '{body.get('KeyId')}' does not exist")
        if key.denied:
            return self._error(
                "AccessDeniedException",
                f"User is not authorized to perform: kms:{target.split('.')[-1]}",
            )
        if target == "TrentService.GetPublicKey":
            algorithms = (
                ["ED25519_SHA_512", "ED25519_PH_SHA_512"]
                if key.spec == "ECC_NIST_EDWARDS25519"
                else ["ECDSA_SHA_256"]
            )
            return self._reply(
                200,
                {
                    "KeyId": key.arn,
                    "PublicKey": _b64(_spki_der(key.private)),
                    "KeySpec": key.spec,
                    "CustomerMasterKeySpec": key.spec,
                    "KeyUsage": key.usage,
                    "SigningAlgorithms": algorithms,
                },
            )
        if target == "TrentService.Sign":
            message = base64.b64decode(body.get("Message", ""))
            if not 1 <= len(message) <= 4096:
                return self._error(
                    "ValidationException", "Message must have length less than or equal to 4096"
                )
            if (
                body.get("SigningAlgorithm") != "ED25519_SHA_512"
                or body.get("MessageType") != "RAW"
            ):
                return self._error("ValidationException", "ED25519_SHA_512 signs RAW messages only")
            return self._reply(
                200,
                {
                    "KeyId": key.arn,
                    "Signature": _b64(key.private.sign(message)),
                    "SigningAlgorithm": "ED25519_SHA_512",
                },
            )
        return self._error("UnknownOperationException", target)


def aws_key(key_id: str, **kwargs: Any) -> AwsKey:
    return AwsKey(key_id, Ed25519PrivateKey.generate(), **kwargs)


def p256_key(key_id: str) -> AwsKey:
    return AwsKey(key_id, ec.generate_private_key(ec.SECP256R1()), spec="ECC_NIST_P256")


# -- Google Cloud KMS ------------------------------------------------------------------------------

TOKEN = "plancache-test-token"


class GcpKms(Served):
    """Cloud KMS's REST surface for asymmetric signing, and an OAuth token endpoint."""

    def __init__(self, keys: dict[str, Any], algorithm: str = "EC_SIGN_ED25519") -> None:
        self.keys = keys
        self.algorithm = algorithm
        self.denied: set[str] = set()
        self.account_keys: list[Any] = []
        httpd = _serve(_GcpHandler, self)
        super().__init__(httpd, f"http://{LOOPBACK}:{httpd.server_address[1]}")

    def service_account(self, directory: Path) -> Path:
        """A service-account key file whose token_uri is this server: google-auth signs a JWT
        assertion with its RSA key and trades it here for a bearer token, as with Google."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.account_keys.append(key.public_key())
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        path = directory / "service-account.json"
        path.write_text(
            json.dumps(
                {
                    "type": "service_account",
                    "project_id": "p",
                    "private_key_id": "1",
                    "private_key": pem,
                    "client_email": "ci@p.iam.gserviceaccount.com",
                    "client_id": "1",
                    "token_uri": f"{self.endpoint}/token",
                }
            )
        )
        return path


def _jwt_verifies(token: str, keys: list[Any]) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric import padding

    parts = token.split(".")
    if len(parts) != 3:
        return False
    signature = base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4))
    for key in keys:
        try:
            key.verify(
                signature, f"{parts[0]}.{parts[1]}".encode(), padding.PKCS1v15(), hashes.SHA256()
            )
            return True
        except InvalidSignature:
            continue
    return False


class _GcpHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, status: str, message: str) -> None:
        self._reply(code, {"error": {"code": code, "message": message, "status": status}})

    def _handle(self, method: str) -> None:
        state: GcpKms = self.server.state  # type: ignore[attr-defined]  # a _StandInServer's
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        path = self.path.split("?", 1)[0]
        state.requests.append(
            {
                "method": method,
                "path": path,
                "body": raw,
                "authorization": self.headers.get("Authorization"),
            }
        )
        if path == "/token":
            return self._reply(
                200, {"access_token": TOKEN, "expires_in": 3600, "token_type": "Bearer"}
            )
        while state.hang:
            time.sleep(0.05)
        bearer = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
        if bearer != TOKEN and not _jwt_verifies(bearer, state.account_keys):
            return self._error(
                401, "UNAUTHENTICATED", "Request had invalid authentication credentials."
            )
        if method == "GET" and path.startswith("/v1/") and path.endswith("/publicKey"):
            name, op = path[len("/v1/") : -len("/publicKey")], "get"
        elif method == "POST" and path.startswith("/v1/") and path.endswith(":asymmetricSign"):
            name, op = path[len("/v1/") : -len(":asymmetricSign")], "sign"
        else:
            return self._error(404, "NOT_FOUND", f"unknown method {method} {path}")
        if name in state.denied:
            return self._error(
                403,
                "PERMISSION_DENIED",
                f"Permission 'cloudkms.cryptoKeyVersions.useToSign' denied on resource '{name}'",
            )
        key = state.keys.get(name)
        if key is None:
            return self._error(404, "NOT_FOUND", f"CryptoKeyVersion {name} not found.")
        if op == "get":
            pem = key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            return self._reply(
                200,
                {
                    "pem": pem.decode(),
                    "algorithm": state.algorithm,
                    "name": name,
                    "protectionLevel": "HSM",
                },
            )
        body = json.loads(raw or b"{}")
        if "digest" in body or "data" not in body:
            return self._error(400, "INVALID_ARGUMENT", "EC_SIGN_ED25519 signs data, not a digest")
        data = base64.b64decode(body["data"])
        return self._reply(
            200, {"signature": _b64(key.sign(data)), "name": name, "protectionLevel": "HSM"}
        )

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")
