"""A local Sigstore instance on 127.0.0.1: OIDC discovery, Fulcio, Rekor v1, and the trust
root and client trust configuration that name them, so sigstore-python's real signing client
signs and its real verifier verifies with no Sigstore service reachable (issue 37 item 6).

Each part speaks the real protocol, cut to what a signing run uses:

- **OIDC**: ``/.well-known/openid-configuration`` and ``/jwks`` of an ES256 issuer;
  :meth:`SigstoreStack.token` mints its tokens (``aud: sigstore``), or, with ``key=``, a forged one.
- **Fulcio** ``POST /api/v2/signingCert``: checks the bearer token against the issuer's JWKS
  (found through its discovery document, as Fulcio does), the CSR's self-signature, then issues
  a ten-minute certificate (SAN: the ``sub``; issuer extensions v1 and v2; code signing) with
  one embedded SCT signed by the stack's CT log key over the precertificate. A GitHub-shaped
  token (``job_workflow_ref=``) is certified as Fulcio's GitHub issuer does it: the SAN is the
  called workflow, and the ``repository``, ``ref``, ``workflow_ref`` and ``event_name`` claims
  become the source repository, ref, build config and build trigger extensions (``.1.12``,
  ``.1.14``, ``.1.18``, ``.1.20``, DER UTF8String). ``othername_sans`` makes the SAN Sigstore's
  ``otherName`` (``.1.7``, a UTF8String), as Fulcio's username issuers have it.
- **Rekor v1** ``POST /api/v1/log/entries`` (``dsse`` 0.0.1): checks the envelope's signature
  with the certificate, appends the canonical body to an RFC 6962 Merkle tree, and answers with
  the inclusion proof, a signed checkpoint and a signed entry timestamp.

Every key is made per stack (CA, CT log, log, OIDC), so two stacks are two foreign instances.
``log_time_shift`` makes the log record a time outside the certificate's validity (a log
whose clock is wrong, signed all the same). ``now=`` sets the instance's clock (a
certificate's start, its SCT's and the log's time) to a chosen moment, so a test signs at the
same moment the log records (issue 48: a keyless statement's ``signed_at`` must agree with
its verified time); :attr:`SigstoreStack.valid_for` gives the root's parts the windows a test
chooses (retired, not yet valid). Servers are threads of the test process, stopped by
:meth:`SigstoreStack.close`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import rfc8785
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

AUDIENCE = "sigstore"
_SCT_OID = x509.ObjectIdentifier("1.3.6.1.4.1.11129.2.4.2")
_ISSUER_V1 = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.1")
_ISSUER_V2 = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.8")
_OTHERNAME = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.7")
_GITHUB_EXTENSIONS = {  # Fulcio's GitHub issuer: claim -> extension (pkg/identity/github)
    "repository": ("1.3.6.1.4.1.57264.1.12", "https://github.com/"),
    "ref": ("1.3.6.1.4.1.57264.1.14", ""),
    "workflow_ref": ("1.3.6.1.4.1.57264.1.18", "https://github.com/"),
    "event_name": ("1.3.6.1.4.1.57264.1.20", ""),
}
_EPOCH = "2020-01-01T00:00:00Z"


def _der(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _utf8_der(text: str) -> bytes:
    raw = text.encode()
    assert len(raw) < 128
    return bytes([0x0C, len(raw)]) + raw


def _leaf(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


class MerkleTree:
    """RFC 6962 over an append-only list of leaf hashes; a complete subtree's root is kept once
    computed (it never changes), so a root or an audit path costs O(log^2 n), not O(n)."""

    def __init__(self, leaves: list[bytes]) -> None:
        self.leaves = leaves
        self._complete: dict[tuple[int, int], bytes] = {}

    def root(self, lo: int = 0, hi: int | None = None) -> bytes:
        """MTH(D[lo:hi])."""
        hi = len(self.leaves) if hi is None else hi
        n = hi - lo
        if n == 1:
            return self.leaves[lo]
        if (lo, hi) in self._complete:
            return self._complete[(lo, hi)]
        k = _split(n)
        value = _node(self.root(lo, lo + k), self.root(lo + k, hi))
        if n & (n - 1) == 0:
            self._complete[(lo, hi)] = value
        return value

    def path(self, m: int, lo: int = 0, hi: int | None = None) -> list[bytes]:
        """PATH(m, D[lo:hi]), bottom-up."""
        hi = len(self.leaves) if hi is None else hi
        if hi - lo == 1:
            return []
        k = _split(hi - lo)
        if m < k:
            return [*self.path(m, lo, lo + k), self.root(lo + k, hi)]
        return [*self.path(m - k, lo + k, hi), self.root(lo, lo + k)]


class SigstoreStack:
    """Three loopback servers and the keys, trust root and trust config of one instance."""

    def __init__(self, *, prefill: int = 5, now: datetime | None = None) -> None:
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        self.ct_key = ec.generate_private_key(ec.SECP256R1())
        self.log_key = ec.generate_private_key(ec.SECP256R1())
        self.oidc_key = ec.generate_private_key(ec.SECP256R1())
        self.log_id = hashlib.sha256(_der(self.log_key)).digest()
        self.ct_id = hashlib.sha256(_der(self.ct_key)).digest()
        self.log_time_shift = timedelta(0)
        self.cert_validity = timedelta(minutes=10)
        self.fixed_now = now
        """The instance's clock (None: the real one)."""
        self.valid_for: dict[str, dict[str, str]] = {}
        """The root's ``validFor`` per part (``ca``, ``ctlog``, ``tlog``): default, from 2020."""
        self.othername_sans = False
        self.san_override: list[x509.GeneralName] | None = None
        """The certificate's SANs, whatever the token says (an attacker's choice of names)."""
        self.replaced_extensions: dict[str, bytes | None] = {}
        """The issuer or GitHub extensions' raw values by dotted OID (None: left out)."""
        self.extra_extensions: list[tuple[str, bytes]] = []
        """More extensions (dotted OID, raw extnValue bytes), after the usual ones."""
        self.tbs_patch: Callable[[bytes], bytes] | None = None
        """Rewrites the certificate's TBS bytes (same length) before the CA signs them: what
        cryptography's builder refuses to write (a duplicate extension)."""
        self.tree = MerkleTree([_leaf(b"prefill %d" % i) for i in range(prefill)])
        self.lock = threading.Lock()
        self.fulcio_requests = 0
        self.rekor_requests = 0
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "plancache-test"),
                x509.NameAttribute(NameOID.COMMON_NAME, "plancache-test-fulcio"),
            ]
        )
        now = self.now()
        ski = x509.SubjectKeyIdentifier.from_public_key(self.ca_key.public_key())
        self.ca_cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=365))
            .not_valid_after(now + timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=1), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                critical=True,
            )
            .add_extension(ski, critical=False)
            .sign(self.ca_key, hashes.SHA256())
        )
        self._servers = {role: self._serve(role) for role in ("oidc", "fulcio", "rekor")}
        self.issuer = self.url("oidc")

    # -- servers ------------------------------------------------------------------------------
    def _serve(self, role: str) -> ThreadingHTTPServer:
        stack = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if role == "oidc" and self.path == "/.well-known/openid-configuration":
                    self._answer(200, {"issuer": stack.issuer, "jwks_uri": stack.issuer + "/jwks"})
                elif role == "oidc" and self.path == "/jwks":
                    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(stack.oidc_key.public_key()))
                    self._answer(200, {"keys": [{**jwk, "kid": "test", "alg": "ES256"}]})
                else:
                    self._answer(404, {"message": "not found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                try:
                    if role == "fulcio" and self.path == "/api/v2/signingCert":
                        self._answer(201, stack.issue(self.headers.get("Authorization", ""), body))
                    elif role == "rekor" and self.path == "/api/v1/log/entries":
                        self._answer(201, stack.log_entry(body))
                    else:
                        self._answer(404, {"message": "not found"})
                except PermissionError as exc:
                    self._answer(401, {"message": str(exc)})
                except ValueError as exc:
                    self._answer(400, {"message": str(exc)})

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def now(self) -> datetime:
        """The instance's time: the chosen moment, else the real clock."""
        return self.fixed_now or datetime.now(timezone.utc)

    def url(self, role: str) -> str:
        return f"http://127.0.0.1:{self._servers[role].server_address[1]}"

    def close(self) -> None:
        for server in self._servers.values():
            server.shutdown()
            server.server_close()

    def __enter__(self) -> SigstoreStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- OIDC ---------------------------------------------------------------------------------
    def token(
        self,
        sub: str,
        *,
        key: ec.EllipticCurvePrivateKey | None = None,
        audience: str = AUDIENCE,
        lifetime: int = 300,
        **extra: str,
    ) -> str:
        """A token of this issuer; ``job_workflow_ref=`` makes it GitHub-shaped (below)."""
        now = int(time.time())
        claims: dict[str, Any] = {"iss": self.issuer, "sub": sub, "aud": audience, "iat": now}
        claims.update(nbf=now, exp=now + lifetime, **extra)
        return jwt.encode(claims, key or self.oidc_key, algorithm="ES256", headers={"kid": "test"})

    def _check_token(self, token: str) -> dict[str, Any]:
        """As Fulcio: the issuer's keys from its discovery document, then the signature."""
        issuer = jwt.decode(token, options={"verify_signature": False})["iss"]
        with urllib.request.urlopen(issuer + "/.well-known/openid-configuration", timeout=5) as r:
            jwks_uri = json.load(r)["jwks_uri"]
        with urllib.request.urlopen(jwks_uri, timeout=5) as r:
            jwks = json.load(r)
        key = jwt.PyJWK(jwks["keys"][0]).key
        try:
            return jwt.decode(
                token, key, algorithms=["ES256"], audience=AUDIENCE, issuer=self.issuer
            )
        except jwt.PyJWTError as exc:
            raise PermissionError(f"invalid identity token: {exc}") from None

    # -- Fulcio -------------------------------------------------------------------------------
    def issue(self, authorization: str, body: dict[str, Any]) -> dict[str, Any]:
        self.fulcio_requests += 1
        claims = self._check_token(authorization.removeprefix("Bearer "))
        csr = x509.load_pem_x509_csr(base64.b64decode(body["certificateSigningRequest"]))
        if not csr.is_signature_valid:
            raise ValueError("the CSR's signature does not verify")
        sub = claims["sub"]
        if "job_workflow_ref" in claims:  # as Fulcio certifies GitHub Actions: not the sub
            sub = "https://github.com/" + claims["job_workflow_ref"]
        san: x509.GeneralName | list[x509.GeneralName] = (
            x509.OtherName(_OTHERNAME, _utf8_der(sub))
            if self.othername_sans
            else x509.UniformResourceIdentifier(sub)
            if "://" in sub
            else x509.RFC822Name(sub)
        )
        now = self.now().replace(microsecond=0)
        # sigstore-python's signer reuses a certificate only while the *real* clock is inside
        # it: one issued at a chosen moment in the past also lasts until the real clock's
        # validity ends (its start, and so the log's time inside it, is what tests choose)
        until = max(now + self.cert_validity, datetime.now(timezone.utc) + self.cert_validity)
        if self.fixed_now is None:
            until = now + self.cert_validity
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([]))
            .issuer_name(self.ca_cert.subject)
            .public_key(csr.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
            .add_extension(
                x509.KeyUsage(True, False, False, False, False, False, False, False, False),
                critical=True,
            )
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(csr.public_key()), critical=False
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.ca_key.public_key()),
                critical=False,
            )
            .add_extension(
                x509.SubjectAlternativeName(
                    self.san_override if self.san_override is not None else [san]
                ),
                critical=True,
            )
        )
        usual = [
            (_ISSUER_V1.dotted_string, self.issuer.encode()),
            (_ISSUER_V2.dotted_string, _utf8_der(self.issuer)),
        ]
        if "job_workflow_ref" in claims:
            for claim, (oid, prefix) in _GITHUB_EXTENSIONS.items():
                if claim in claims:
                    usual.append((oid, _utf8_der(prefix + claims[claim])))
        for dotted, raw in usual:
            value = self.replaced_extensions.get(dotted, raw)
            if value is not None:
                ext = x509.UnrecognizedExtension(x509.ObjectIdentifier(dotted), value)
                builder = builder.add_extension(ext, critical=False)
        for dotted, raw in self.extra_extensions:
            extra = x509.UnrecognizedExtension(x509.ObjectIdentifier(dotted), raw)
            builder = builder.add_extension(extra, critical=False)
        precert = builder.sign(self.ca_key, hashes.SHA256())
        patch = self.tbs_patch or (lambda tbs: tbs)
        sct = self._sct(patch(precert.tbs_certificate_bytes))
        sct_list = struct.pack("!H", len(sct) + 2) + struct.pack("!H", len(sct)) + sct
        octets = bytes([0x04]) + _der_length(len(sct_list)) + sct_list
        leaf = builder.add_extension(x509.UnrecognizedExtension(_SCT_OID, octets), critical=False)
        cert = leaf.sign(self.ca_key, hashes.SHA256())
        if self.tbs_patch is not None:
            cert = self._resigned(cert, self.tbs_patch(cert.tbs_certificate_bytes))
        pem = [c.public_bytes(serialization.Encoding.PEM).decode() for c in (cert, self.ca_cert)]
        return {"signedCertificateEmbeddedSct": {"chain": {"certificates": pem}}}

    def _resigned(self, cert: x509.Certificate, tbs: bytes) -> x509.Certificate:
        """``cert`` with its TBS replaced by ``tbs`` (same length) and signed again by the CA."""
        der = cert.public_bytes(serialization.Encoding.DER)
        old = cert.tbs_certificate_bytes
        assert len(tbs) == len(old)
        at = der.index(old) + len(old)
        algorithm = der[at : at + 2 + der[at + 1]]  # a short-form SEQUENCE
        signature = self.ca_key.sign(tbs, ec.ECDSA(hashes.SHA256()))
        bits = b"\x03" + _der_length(len(signature) + 1) + b"\x00" + signature
        body = tbs + algorithm + bits
        return x509.load_der_x509_certificate(b"\x30" + _der_length(len(body)) + body)

    def _sct(self, tbs: bytes) -> bytes:
        """One RFC 6962 SCT over a precertificate entry, signed by the CT log key."""
        timestamp = int(self.now().timestamp() * 1000)
        issuer_key_hash = hashlib.sha256(_der(self.ca_key)).digest()
        entry = issuer_key_hash + struct.pack("!I", len(tbs))[1:] + tbs
        signed = struct.pack("!BBQH", 0, 0, timestamp, 1) + entry + struct.pack("!H", 0)
        signature = self.ct_key.sign(signed, ec.ECDSA(hashes.SHA256()))
        return (
            struct.pack("!B", 0)
            + self.ct_id
            + struct.pack("!QH", timestamp, 0)
            + struct.pack("!BBH", 4, 3, len(signature))
            + signature
        )

    # -- Rekor --------------------------------------------------------------------------------
    def log_entry(self, proposed: dict[str, Any]) -> dict[str, Any]:
        self.rekor_requests += 1
        if proposed.get("kind") != "dsse" or proposed.get("apiVersion") != "0.0.1":
            raise ValueError("only dsse 0.0.1 entries")
        content = proposed["spec"]["proposedContent"]
        envelope = json.loads(content["envelope"])
        verifier = base64.b64decode(content["verifiers"][0])
        cert = x509.load_pem_x509_certificate(verifier)
        payload = base64.b64decode(envelope["payload"])
        type_ = envelope["payloadType"].encode()
        pae = b"DSSEv1 %d %s %d %s" % (len(type_), type_, len(payload), payload)
        sigs = [base64.b64decode(s["sig"]) for s in envelope["signatures"]]
        public = cert.public_key()
        assert isinstance(public, ec.EllipticCurvePublicKey)
        for sig in sigs:
            public.verify(sig, pae, ec.ECDSA(hashes.SHA256()))  # InvalidSignature -> 500
        body = rfc8785.dumps(
            {
                "apiVersion": "0.0.1",
                "kind": "dsse",
                "spec": {
                    "envelopeHash": {
                        "algorithm": "sha256",
                        "value": hashlib.sha256(content["envelope"].encode()).hexdigest(),
                    },
                    "payloadHash": {
                        "algorithm": "sha256",
                        "value": hashlib.sha256(payload).hexdigest(),
                    },
                    "signatures": [
                        {"signature": _b64(sig), "verifier": content["verifiers"][0]}
                        for sig in sigs
                    ],
                },
            }
        )
        with self.lock:
            index = len(self.tree.leaves)
            self.tree.leaves.append(_leaf(body))
            size = index + 1
            root = self.tree.root(0, size)
            proof = self.tree.path(index, 0, size)
        integrated = int((self.now() + self.log_time_shift).timestamp())
        set_payload = rfc8785.dumps(
            {
                "body": _b64(body),
                "integratedTime": integrated,
                "logID": self.log_id.hex(),
                "logIndex": index,
            }
        )
        return {
            hashlib.sha256(body).hexdigest(): {
                "body": _b64(body),
                "integratedTime": integrated,
                "logID": self.log_id.hex(),
                "logIndex": index,
                "verification": {
                    "inclusionProof": {
                        "checkpoint": self._checkpoint(size, root),
                        "hashes": [h.hex() for h in proof],
                        "logIndex": index,
                        "rootHash": root.hex(),
                        "treeSize": size,
                    },
                    "signedEntryTimestamp": _b64(
                        self.log_key.sign(set_payload, ec.ECDSA(hashes.SHA256()))
                    ),
                },
            }
        }

    def _checkpoint(self, size: int, root: bytes) -> str:
        note = f"127.0.0.1 - 4242\n{size}\n{_b64(root)}\n"
        signature = self.log_key.sign(note.encode(), ec.ECDSA(hashes.SHA256()))
        return note + f"\n\u2014 127.0.0.1 {_b64(self.log_id[:4] + signature)}\n"

    # -- trust root and trust config ------------------------------------------------------------
    def trusted_root(self) -> dict[str, Any]:
        def key(k: ec.EllipticCurvePrivateKey, url: str, part: str) -> dict[str, Any]:
            return {
                "baseUrl": url,
                "hashAlgorithm": "SHA2_256",
                "publicKey": {
                    "rawBytes": _b64(_der(k)),
                    "keyDetails": "PKIX_ECDSA_P256_SHA_256",
                    "validFor": self.valid_for.get(part, {"start": _EPOCH}),
                },
                "logId": {"keyId": _b64(hashlib.sha256(_der(k)).digest())},
            }

        return {
            "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
            "tlogs": [key(self.log_key, self.url("rekor"), "tlog")],
            "certificateAuthorities": [
                {
                    "subject": {
                        "organization": "plancache-test",
                        "commonName": "plancache-test-fulcio",
                    },
                    "uri": self.url("fulcio"),
                    "certChain": {
                        "certificates": [
                            {
                                "rawBytes": _b64(
                                    self.ca_cert.public_bytes(serialization.Encoding.DER)
                                )
                            }
                        ]
                    },
                    "validFor": self.valid_for.get("ca", {"start": _EPOCH}),
                }
            ],
            "ctlogs": [key(self.ct_key, self.url("fulcio") + "/ct", "ctlog")],
            "timestampAuthorities": [],
        }

    def trusted_root_bytes(self) -> bytes:
        return json.dumps(self.trusted_root(), indent=1).encode()

    def trust_config(self) -> dict[str, Any]:
        def service(url: str) -> dict[str, Any]:
            return {
                "url": url,
                "majorApiVersion": 1,
                "validFor": {"start": _EPOCH},
                "operator": "test",
            }

        return {
            "mediaType": "application/vnd.dev.sigstore.clienttrustconfig.v0.1+json",
            "trustedRoot": self.trusted_root(),
            "signingConfig": {
                "mediaType": "application/vnd.dev.sigstore.signingconfig.v0.2+json",
                "caUrls": [service(self.url("fulcio"))],
                "oidcUrls": [service(self.issuer)],
                "rekorTlogUrls": [service(self.url("rekor"))],
                "tsaUrls": [],
                "rekorTlogConfig": {"selector": "ANY"},
                "tsaConfig": {"selector": "ANY"},
            },
        }

    def trust_config_bytes(self) -> bytes:
        return json.dumps(self.trust_config()).encode()

    def client_files(self, directory: Path, identity: str, trusted: str) -> dict[str, Path]:
        """What a signer and a verifier of this instance are given, written in ``directory``:
        the trust configuration, the trusted root, a token for ``identity`` and a trusted-keys
        file holding the line ``trusted``."""
        paths = {
            "config": directory / "trust_config.json",
            "root": directory / "trusted_root.json",
            "token": directory / "token",
            "trusted": directory / "trusted",
        }
        paths["config"].write_bytes(self.trust_config_bytes())
        paths["root"].write_bytes(self.trusted_root_bytes())
        paths["token"].write_text(self.token(identity))
        paths["trusted"].write_text(trusted + "\n")
        return paths


def _der_length(n: int) -> bytes:
    if n < 128:
        return bytes([n])
    raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(raw)]) + raw
