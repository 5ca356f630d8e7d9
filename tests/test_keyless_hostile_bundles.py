"""Hostile Sigstore bundles (issue 37's edges, item 4): each is one reason, never a traceback,
never a pass.

A signature object comes from a store, so a bundle is hostile bytes: a chain of a thousand
certificates, a 60 KiB certificate, a log entry that is genuine but for another payload, a log
time before the certificate was valid, duplicate keys, a huge ``logIndex``, nesting deep enough
to break a recursive parser, a ``messageSignature`` bundle, an older media type, an inclusion
proof of 10^5 hashes; and a verifier whose clock is far off, which must come to what it would
for a key's signature. Tried at a plan sidecar's cap (64 KiB) and at a compile-cache manifest
signature's (16 MiB), where the big ones get past the cap and into the parsers. The bundles are
made once for the module through the local Fulcio and Rekor (tests/sigstore_stack.py).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from conftest import FP, NOW, make_signer, plan_bytes
from plancache.keys.schemes import load_signer
from plancache.trust import envelope as dsse
from plancache.trust.errors import Reason, Rejected
from plancache.trust.keyless.dsse_extension import as_extension
from plancache.trust.keyless.sigstore_bundle import open_bundle
from plancache.trust.keyring.identities import IdentityPolicy
from plancache.trust.keyring.keys import Keyring, TrustedKey
from plancache.trust.keyring.trusted_keys_file import parse_trusted_keys
from plancache.trust.plans.plan import plan_name
from plancache.trust.signing import sign_plan
from plancache.trust.verify import verify_plan
from sigstore_stack import SigstoreStack

IDENTITY = "https://github.com/acme/serving/.github/workflows/bake.yml@refs/heads/main"
NAME = plan_name(FP)
OTHER = "fedcba9876543210"
PLAN_CAP = 64 * 1024
MANIFEST_CAP = 16 * 2**20
EXPIRES = NOW + timedelta(days=30)


@dataclass
class Made:
    stack: SigstoreStack
    sidecar: bytes
    other: bytes
    """The same signer's bundle for another plan: another payload, its own genuine log entry."""
    skewed: bytes
    """Logged 30 minutes before its certificate's notBefore (a log whose clock is wrong)."""
    skewed_root: bytes
    key_sidecar: bytes
    key: TrustedKey

    def policy(self, root: bytes | None = None) -> IdentityPolicy:
        ids = parse_trusted_keys(
            f"sigstore issuer={self.stack.issuer} identity={IDENTITY}\n", "trusted"
        ).identities
        assert ids is not None
        return ids.with_root(root or self.stack.trusted_root_bytes())


def _sign(stack: SigstoreStack, folder: Path, fp: str) -> bytes:
    signer = load_signer(
        "sigstore",
        {
            "SIGSTORE_ID_TOKEN": stack.token(IDENTITY),
            "PLANCACHE_SIGSTORE_TRUST_CONFIG": str(folder / f"{id(stack)}.json"),
        },
    )
    return sign_plan(plan_name(fp), plan_bytes(fp=fp), signer, NOW, expires_at=EXPIRES)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Made]:
    folder = tmp_path_factory.mktemp("bundles")
    with SigstoreStack(now=NOW) as stack, SigstoreStack(now=NOW) as skewed:
        skewed.log_time_shift = timedelta(minutes=-30)
        for s in (stack, skewed):
            (folder / f"{id(s)}.json").write_bytes(s.trust_config_bytes())
        config = {
            "SIGSTORE_ID_TOKEN": stack.token(IDENTITY),
            "PLANCACHE_SIGSTORE_TRUST_CONFIG": str(folder / f"{id(stack)}.json"),
        }
        signer = load_signer("sigstore", config)  # one certificate for both plans
        sidecar = sign_plan(NAME, plan_bytes(), signer, NOW, expires_at=EXPIRES)
        other = sign_plan(plan_name(OTHER), plan_bytes(fp=OTHER), signer, NOW, expires_at=EXPIRES)
        key = make_signer()
        yield Made(
            stack,
            sidecar,
            other,
            _sign(skewed, folder, FP),
            skewed.trusted_root_bytes(),
            sign_plan(NAME, plan_bytes(), key, NOW, expires_at=EXPIRES),
            TrustedKey(key.keyid, "ci", key.public),
        )


def _json(data: bytes) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(data)
    return loaded


def _bytes(bundle: dict[str, Any]) -> bytes:
    return json.dumps(bundle).encode() + b"\n"


def _entry(bundle: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = bundle["verificationMaterial"]["tlogEntries"][0]
    return entry


def _reason(data: bytes, policy: IdentityPolicy, cap: int = MANIFEST_CAP) -> Reason:
    """The one reason ``open_bundle`` gives: a pass, or any exception but ``Rejected``, fails."""
    with pytest.raises(Rejected) as caught:
        open_bundle(data, policy, cap)
    detail = caught.value.detail
    assert "\n" not in detail and len(detail) < 600, detail
    return caught.value.reason


def _certificate(size: int, *, issuer_key: ec.EllipticCurvePrivateKey | None = None) -> bytes:
    """A DER certificate of about ``size`` bytes (one big private extension), from a CA no
    trust root holds."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hostile")])
    now = datetime.now(timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(IDENTITY)]), critical=False
        )
        .add_extension(
            x509.UnrecognizedExtension(
                x509.ObjectIdentifier("1.3.6.1.4.1.99999.1"), b"\x04" + b"x" * size
            ),
            critical=False,
        )
        .sign(issuer_key or key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.DER)


# -- the certificates ------------------------------------------------------------------------------


def test_a_chain_of_a_thousand_certificates_is_malformed(made: Made) -> None:
    bundle = _json(made.sidecar)
    leaf = bundle["verificationMaterial"].pop("certificate")
    small = base64.b64encode(_certificate(0)).decode()
    chain = [leaf] + [{"rawBytes": small}] * 999
    bundle["verificationMaterial"]["x509CertificateChain"] = {"certificates": chain}
    data = _bytes(bundle)
    assert _reason(data, made.policy(), PLAN_CAP) is Reason.TOO_LARGE
    assert _reason(data, made.policy()) is Reason.MALFORMED
    bundle["verificationMaterial"]["certificate"] = leaf  # and beside the certificate
    assert _reason(_bytes(bundle), made.policy()) is Reason.MALFORMED


def test_a_60_kib_certificate_is_one_reason(made: Made) -> None:
    bundle = _json(made.sidecar)
    raw = _certificate(60 * 1024)
    assert len(raw) > 60 * 1024
    bundle["verificationMaterial"]["certificate"]["rawBytes"] = base64.b64encode(raw).decode()
    data = _bytes(bundle)
    assert _reason(data, made.policy(), PLAN_CAP) is Reason.TOO_LARGE
    assert _reason(data, made.policy()) is Reason.FOREIGN_TRUST_ROOT


# -- the log entry ---------------------------------------------------------------------------------


def test_a_genuine_log_entry_of_another_payload_is_a_bad_log_proof(made: Made) -> None:
    """Same certificate, a real entry with a valid proof and SET: but it logs the other plan."""
    bundle = _json(made.sidecar)
    bundle["verificationMaterial"]["tlogEntries"] = _json(made.other)["verificationMaterial"][
        "tlogEntries"
    ]
    assert _reason(_bytes(bundle), made.policy()) is Reason.BAD_LOG_PROOF


def test_a_log_body_naming_another_payloads_hash_is_a_bad_log_proof(made: Made) -> None:
    bundle = _json(made.sidecar)
    entry = _entry(bundle)
    body = json.loads(base64.b64decode(entry["canonicalizedBody"]))
    other_payload = base64.b64decode(_json(made.other)["dsseEnvelope"]["payload"])
    body["spec"]["payloadHash"]["value"] = hashlib.sha256(other_payload).hexdigest()
    entry["canonicalizedBody"] = base64.b64encode(json.dumps(body).encode()).decode()
    assert _reason(_bytes(bundle), made.policy()) is Reason.BAD_LOG_PROOF


def test_a_log_time_before_the_certificate_is_outside_its_validity(made: Made) -> None:
    assert _reason(made.skewed, made.policy(made.skewed_root)) is Reason.CERT_OUTSIDE_VALIDITY


@pytest.mark.parametrize(
    "value", ["9" * 30, "-5", 10**30, "9" * 5000, "1e400", "0x10", 5.0, None, [5]]
)
def test_a_huge_or_odd_log_index_is_one_reason(made: Made, value: object) -> None:
    for where in ("entry", "proof"):
        bundle = _json(made.sidecar)
        entry = _entry(bundle)
        (entry if where == "entry" else entry["inclusionProof"])["logIndex"] = value
        if isinstance(value, int) and len(str(value)) > 1000:
            data = json.dumps(bundle).replace(json.dumps(value), "9" * 5000).encode()
        else:
            data = _bytes(bundle)
        assert _reason(data, made.policy()) in (Reason.MALFORMED, Reason.BAD_LOG_PROOF)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("0", Reason.NO_LOG_PROOF),  # nothing says when: once read as a foreign trust root
        (None, Reason.NO_LOG_PROOF),  # absent, as protobuf JSON writes a zero
        ("9" * 18, Reason.BAD_LOG_PROOF),  # once "[Errno 75] Value too large" (bad-bundle)
        ("253402300800", Reason.BAD_LOG_PROOF),  # the first second of year 10000
        ("12", Reason.BAD_LOG_PROOF),  # 1970: once "outside the certificate", the log's word
        ("-1", Reason.MALFORMED),
        ("1e9", Reason.MALFORMED),
        ("\u0661\u0662", Reason.MALFORMED),  # Arabic-Indic digits, which pydantic reads as 12
    ],
)
def test_an_integrated_time_that_is_no_time_is_one_reason(
    made: Made, value: str | None, reason: Reason
) -> None:
    bundle = _json(made.sidecar)
    if value is None:
        _entry(bundle).pop("integratedTime")
    else:
        _entry(bundle)["integratedTime"] = value
    assert _reason(_bytes(bundle), made.policy()) is reason


def test_an_inclusion_proof_of_a_hundred_thousand_hashes_is_a_bad_log_proof(made: Made) -> None:
    bundle = _json(made.sidecar)
    proof = _entry(bundle)["inclusionProof"]
    proof["hashes"] = [base64.b64encode(bytes([i % 256]) * 32).decode() for i in range(10**5)]
    data = _bytes(bundle)
    assert len(data) < MANIFEST_CAP
    assert _reason(data, made.policy()) is Reason.BAD_LOG_PROOF


# -- the JSON --------------------------------------------------------------------------------------


def _duplicate(text: str, key: str) -> bytes:
    """The bundle's text with ``key`` given twice: a decoy first, then its own value (a parser
    keeping the last would see the genuine bundle; one keeping the first, the decoy)."""
    doubled, count = re.subn(rf'"{key}":\s*', f'"{key}": "decoy", "{key}": ', text, count=1)
    assert count == 1
    return doubled.encode()


@pytest.mark.parametrize("key", ["mediaType", "payload", "logIndex", "rawBytes"])
def test_duplicate_keys_are_malformed(made: Made, key: str) -> None:
    assert _reason(_duplicate(made.sidecar.decode(), key), made.policy()) is Reason.MALFORMED


@pytest.mark.parametrize("field", ["payload", "sig"])
@pytest.mark.parametrize("respell", ["junk", "newline", "after-padding"])
def test_a_payload_or_signature_in_lenient_base64_is_malformed(
    made: Made, field: str, respell: str
) -> None:
    """sigstore-python decodes a bundle's DSSE payload and signature leniently, so these verified
    as the genuine bytes, while plancache's own readers of what a bundle claims (``ls`` without
    keys, ``prune``, ``inspect``, co-signing) refused them: the two must read the same bytes."""
    assert open_bundle(made.sidecar, made.policy(), PLAN_CAP)[1]  # the genuine one verifies
    bundle = _json(made.sidecar)
    envelope = bundle["dsseEnvelope"]
    holder = envelope if field == "payload" else envelope["signatures"][0]
    value = holder[field]
    holder[field] = {
        "junk": value[:8] + "!" + value[8:],
        "newline": value[:8] + "\n" + value[8:],
        "after-padding": value + ("QUJD" if value.endswith("=") else "=="),  # both ignored
    }[respell]
    assert base64.b64decode(holder[field]) == base64.b64decode(value)  # the lenient reading
    assert _reason(_bytes(bundle), made.policy()) is Reason.MALFORMED


# A bare bundle and the extension entry co-signing makes of it must agree (red team 8b, after
# chores8): an entry's ext had to be what sigstore-python writes back for it, a bare bundle's
# material did not, so a respelt bundle (logIndex "0139", a stray character in the certificate's
# base64, which sigstore-python drops) verified, and the envelope co-signing made of it lost
# that keyless signature as malformed; sealing.as_envelope promises they verify alike.


def _zero_before_log_index(bundle: dict[str, Any]) -> None:
    entry = bundle["verificationMaterial"]["tlogEntries"][0]
    entry["logIndex"] = "0" + entry["logIndex"]


def _junk_in_certificate(bundle: dict[str, Any]) -> None:
    cert = bundle["verificationMaterial"]["certificate"]
    cert["rawBytes"] = cert["rawBytes"][:12] + "!" + cert["rawBytes"][12:]


def _junk_in_root_hash(bundle: dict[str, Any]) -> None:
    proof = bundle["verificationMaterial"]["tlogEntries"][0]["inclusionProof"]
    proof["rootHash"] = proof["rootHash"][:4] + "\n" + proof["rootHash"][4:]


RESPELLINGS = [_zero_before_log_index, _junk_in_certificate, _junk_in_root_hash]


def _outcome_of(check: Callable[[], object]) -> str:
    try:
        check()
    except Rejected as exc:
        return exc.reason.value
    return "ok"


@pytest.mark.parametrize("respell", RESPELLINGS)
def test_a_bundle_and_its_extension_entry_agree(
    made: Made,
    respell: Callable[[dict[str, Any]], None],
) -> None:
    """The same respelt material verifies both ways or neither: a bundle that verifies and whose
    co-signed entry is ``malformed`` costs the plan its keyless signature after co-signing."""
    policy = made.policy()
    assert open_bundle(made.sidecar, policy, PLAN_CAP)[1]  # the genuine one verifies
    bundle = _json(made.sidecar)
    respell(bundle)
    respelt = _bytes(bundle)
    as_bundle = _outcome_of(lambda: open_bundle(respelt, policy, PLAN_CAP))
    keyring = Keyring(identities=policy)
    as_entry = _outcome_of(
        lambda: verify_plan(NAME, plan_bytes(), dsse.encode(as_extension(respelt)), keyring, NOW)
    )
    assert as_bundle == as_entry


@pytest.mark.parametrize("respell", RESPELLINGS)
def test_a_bare_bundle_verifies_in_one_spelling_of_its_material(
    made: Made,
    respell: Callable[[dict[str, Any]], None],
) -> None:
    """A respelt bundle is refused as ``malformed``, as its extension entry is: one keyless
    signature, one spelling that verifies."""
    bundle = _json(made.sidecar)
    respell(bundle)
    with pytest.raises(Rejected) as info:
        open_bundle(_bytes(bundle), made.policy(), PLAN_CAP)
    assert info.value.reason is Reason.MALFORMED


@pytest.mark.parametrize("field", ["payload", "sig"])
def test_co_signing_refuses_the_base64_a_bundle_is_refused_for(made: Made, field: str) -> None:
    """Python's "strict" base64 (``validate=True``) reads padding a value does not need on 3.10
    and 3.11 (``AAAA=`` is three zero bytes): a bundle so spelt is ``malformed``, so the envelope
    co-signing makes of it must not be one that verifies (as_extension re-encoded the bytes, so
    the entry was canonical and verified where its bundle was refused)."""
    bundle = _json(made.sidecar)
    envelope = bundle["dsseEnvelope"]
    holder = envelope if field == "payload" else envelope["signatures"][0]
    holder[field] = base64.b64encode(bytes(72)).decode() + "="  # no padding needed: one more
    assert _reason(_bytes(bundle), made.policy()) is Reason.MALFORMED
    with pytest.raises(Rejected) as info:
        as_extension(_bytes(bundle))
    assert info.value.reason is Reason.MALFORMED and "canonical base64" in info.value.detail


def test_the_genuine_bundle_is_its_own_canonical_material(made: Made) -> None:
    """What sigstore-python wrote is what it writes back: the check refuses no genuine bundle."""
    from sigstore.models import Bundle

    again = json.loads(Bundle.from_json(made.sidecar).to_json())
    assert again["verificationMaterial"] == _json(made.sidecar)["verificationMaterial"]


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_deep_nesting_is_malformed(made: Made, depth: int) -> None:
    text = made.sidecar.decode().rstrip()
    data = (text[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}").encode()
    reason = _reason(data, made.policy())
    assert reason is Reason.MALFORMED


def _message_signature(bundle: dict[str, Any]) -> None:
    envelope = bundle.pop("dsseEnvelope")
    bundle["messageSignature"] = {
        "messageDigest": {"algorithm": "SHA2_256", "digest": base64.b64encode(bytes(32)).decode()},
        "signature": envelope["signatures"][0]["sig"],
    }


@pytest.mark.parametrize(
    "change",
    [
        _message_signature,
        lambda b: b.update(messageSignature={"signature": "AAAA"}),
        lambda b: b.update(mediaType="application/vnd.dev.sigstore.bundle+json;version=0.1"),
        lambda b: b.update(mediaType="application/vnd.dev.sigstore.bundle+json;version=0.2"),
        lambda b: b.update(mediaType="application/vnd.dev.sigstore.bundle.v0.4+json"),
        lambda b: b["verificationMaterial"].update(publicKey={"hint": "x"}),
    ],
    ids=["message-signature", "both", "v0.1", "v0.2", "v0.4", "public-key"],
)
def test_another_kind_of_bundle_is_malformed(
    made: Made, change: Callable[[dict[str, Any]], None]
) -> None:
    bundle = _json(made.sidecar)
    change(bundle)
    assert _reason(_bytes(bundle), made.policy()) is Reason.MALFORMED


# -- the verifier's clock --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "now",
    [
        datetime(1, 1, 1, tzinfo=timezone.utc),
        datetime(1970, 1, 1, tzinfo=timezone.utc),
        NOW - timedelta(days=1),
        NOW,
        NOW + timedelta(days=60),
        datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc),
    ],
    ids=["year-1", "epoch", "a-day-early", "now", "after-expiry", "year-9999"],
)
def test_an_odd_clock_judges_a_bundle_as_it_judges_a_key(made: Made, now: datetime) -> None:
    keyring = Keyring({made.key.keyid: made.key}, identities=made.policy())

    def outcome(sidecar: bytes) -> str:
        try:
            verify_plan(NAME, plan_bytes(), sidecar, keyring, now)
        except Rejected as exc:
            return exc.reason.value
        return "ok"

    keyless = outcome(made.sidecar)
    assert keyless == outcome(made.key_sidecar)
    assert (keyless == "ok") == (now == NOW)
