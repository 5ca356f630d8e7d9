"""Keyless signatures inside a DSSE envelope (DSSE v1.1 signature extensions, issue 37): the
canonical form, the caps, what is refused before sigstore-python is imported, and real
public-good bundles (tests/data/sigstore/) turned into extension signatures, verified offline
beside a key's signature over the same payload."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest

from conftest import NOW, keyring_of, make_signer
from plancache.keys.sigstore_root import public_good_root
from plancache.trust import envelope as dsse
from plancache.trust.errors import Reason, Rejected
from plancache.trust.keyless.dsse_extension import as_extension, rebuilt_bundle
from plancache.trust.keyring.keys import Ed25519Signer, Keyring
from plancache.trust.keyring.signatories import current_signers, open_envelope
from plancache.trust.keyring.trusted_keys_file import parse_trusted_keys

DATA = Path(__file__).parent / "data" / "sigstore"
GITHUB = "https://token.actions.githubusercontent.com"
WORKFLOW = "https://github.com/terraform-linters/tflint-ruleset-aws/.github/workflows/release.yml"
KIND = "application/vnd.dev.sigstore.verificationmaterial;version=0.3"


def _bundle(version: str) -> bytes:
    return (DATA / f"public-good-github-tflint-ruleset-aws-v{version}.sigstore.json").read_bytes()


def _line(version: str) -> str:
    return f"sigstore issuer={GITHUB} identity={WORKFLOW}@refs/tags/v{version}\n"


def _keyring(lines: str, *keys: Ed25519Signer, threshold: int = 1) -> Keyring:
    ids = parse_trusted_keys(lines, "trusted").identities
    assert ids is not None
    return Keyring(
        keyring_of(*keys).keys, frozenset(), threshold, ids.with_root(public_good_root())
    )


def _with_key(env: dsse.Envelope, key: Ed25519Signer) -> dsse.Envelope:
    signature = dsse.Signature(key.keyid, key.sign(dsse.pae(env.payload_type, env.payload)))
    return dsse.Envelope(env.payload_type, env.payload, (*env.signatures, signature))


def test_a_bundle_becomes_one_canonical_extension_entry() -> None:
    bundle = json.loads(_bundle("0.34.0"))
    env = as_extension(_bundle("0.34.0"))
    (entry,) = json.loads(dsse.encode(env))["signatures"]
    assert entry == {
        "extension": {"ext": bundle["verificationMaterial"], "kind": KIND},
        "keyid": "",
        "sig": bundle["dsseEnvelope"]["signatures"][0]["sig"],
    }
    assert dsse.decode(dsse.encode(env)) == env  # canonical: decode, re-encode, compare
    assert is_rebuilt(env)


def is_rebuilt(env: dsse.Envelope) -> bool:
    """The rebuilt bundle holds exactly the original's envelope and verification material."""
    original = json.loads(_bundle("0.34.0"))
    rebuilt = json.loads(rebuilt_bundle(env.payload_type, env.payload, env.signatures[0]))
    return bool(
        rebuilt["verificationMaterial"] == original["verificationMaterial"]
        and rebuilt["dsseEnvelope"]["payload"] == original["dsseEnvelope"]["payload"]
        and rebuilt["dsseEnvelope"]["signatures"][0]["sig"]
        == original["dsseEnvelope"]["signatures"][0]["sig"]
    )


@pytest.mark.parametrize(("version", "index"), [("0.34.0", 139993835), ("0.35.0", 149329939)])
def test_a_public_good_bundle_as_an_extension_verifies_offline(version: str, index: int) -> None:
    env = as_extension(_bundle(version))
    payload, (who,) = open_envelope(dsse.encode(env), _keyring(_line(version)))
    assert json.loads(payload)["subject"][0]["name"] == "checksums.txt"
    assert (who.keyid, who.log_index) == (f"sigstore:{WORKFLOW}@refs/tags/v{version}", index)


def test_a_rekor_v2_bundle_as_an_extension_verifies_under_its_root() -> None:
    """A hashedrekord 0.0.2 entry (it covers the PAE and the signature) with an RFC 3161
    timestamp, no SET: the staging instance's bundle, turned into an extension entry."""
    data = (DATA / "staging-rekor-v2-conformance-beacon.sigstore.json").read_bytes()
    identity = (
        "https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/"
        ".github/workflows/extremely-dangerous-oidc-beacon.yml@refs/heads/main"
    )
    staging = (
        files("sigstore._store")
        .joinpath("https%3A%2F%2Ftuf-repo-cdn.sigstage.dev", "trusted_root.json")
        .read_bytes()
    )
    ids = parse_trusted_keys(f"sigstore issuer={GITHUB} identity={identity}\n", "t").identities
    assert ids is not None
    _, (who,) = open_envelope(
        dsse.encode(as_extension(data)), Keyring(identities=ids.with_root(staging))
    )
    assert who.identity == identity and who.log_time is not None


def test_a_key_and_a_real_identity_meet_a_threshold_of_two() -> None:
    key = make_signer()
    env = _with_key(as_extension(_bundle("0.34.0")), key)
    keyring = _keyring(_line("0.34.0"), key, threshold=2)
    _, signers = open_envelope(dsse.encode(env), keyring)
    assert [s.keyid for s in signers] == [f"sigstore:{WORKFLOW}@refs/tags/v0.34.0", key.keyid]
    logged = signers[0].log_time  # type: ignore[union-attr]  # the keyless signer's
    assert logged is not None
    kept = current_signers(
        signers, keyring, signed_at=logged, expires_at=None, now=logged + timedelta(days=1)
    )
    assert len(kept) == 2
    other = _keyring(_line("0.35.0"), key, threshold=2)  # another workflow trusted: the key alone
    _, signers = open_envelope(dsse.encode(env), other)
    with pytest.raises(Rejected) as caught:
        current_signers(signers, other, signed_at=logged, expires_at=None, now=logged)
    assert caught.value.reason is Reason.THRESHOLD


def test_an_untrusted_identity_is_ignored_and_named_when_nothing_counts() -> None:
    key = make_signer()
    env = _with_key(as_extension(_bundle("0.34.0")), key)
    _, signers = open_envelope(dsse.encode(env), _keyring(_line("0.35.0"), key))
    assert [s.keyid for s in signers] == [key.keyid]  # the other workflow's entry: ignored
    with pytest.raises(Rejected) as caught:
        open_envelope(dsse.encode(env), _keyring(_line("0.35.0"), make_signer()))
    assert caught.value.reason is Reason.WRONG_IDENTITY  # more telling than untrusted-key
    revoked = _line("0.34.0") + "@revoked " + _line("0.34.0")
    _, signers = open_envelope(dsse.encode(env), _keyring(revoked, key))
    assert [s.keyid for s in signers] == [key.keyid]  # a revoked identity never counts
    with pytest.raises(Rejected) as caught:
        open_envelope(dsse.encode(env), _keyring(revoked, make_signer()))
    assert caught.value.reason is Reason.REVOKED


def test_an_extension_moved_under_another_payload_never_counts() -> None:
    mine, other = as_extension(_bundle("0.34.0")), as_extension(_bundle("0.35.0"))
    moved = dsse.Envelope(other.payload_type, other.payload, mine.signatures)
    with pytest.raises(Rejected) as caught:
        open_envelope(dsse.encode(moved), _keyring(_line("0.34.0")))
    assert caught.value.reason is Reason.BAD_SIGNATURE
    key = make_signer()
    _, signers = open_envelope(dsse.encode(_with_key(moved, key)), _keyring(_line("0.34.0"), key))
    assert [s.keyid for s in signers] == [key.keyid]


def _entry(ext: Any = None, **fields: Any) -> dict[str, Any]:
    entry = {"extension": {"ext": ext or {"certificate": {}}, "kind": KIND}, "keyid": "", "sig": ""}
    entry.update(fields)
    return entry


def _envelope(*entries: dict[str, Any], payload: str = "e30=") -> bytes:
    obj = {"payload": payload, "payloadType": dsse.PAYLOAD_TYPE, "signatures": list(entries)}
    return (json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n").encode()


def _cases() -> list[tuple[bytes, str]]:
    good = _envelope(_entry())
    return [
        (_envelope(_entry(extension={"ext": {}, "kind": "application/x-other"})), "malformed"),
        (_envelope(_entry(extension={"ext": {}, "kind": KIND, "more": 1})), "malformed"),
        (_envelope(_entry(extension={"ext": [], "kind": KIND})), "malformed"),
        (_envelope(_entry(extra=1)), "malformed"),
        (_envelope(_entry(keyid="SHA256:x")), "malformed"),
        (good.replace(b'"keyid"', b' "keyid"'), "malformed"),
        (good.replace(b"\n", b"\n\n"), "malformed"),
        (_envelope(_entry(ext={"pad": "x" * dsse.MAX_EXT_BYTES})), "too-large"),
        (_envelope(*[_entry()] * (dsse.MAX_SIGNATURES + 1)), "malformed"),
    ]


def test_malformed_extensions_are_refused_before_sigstore_is_imported(tmp_path: Path) -> None:
    """Each refused while parsing the envelope, under a keyring that trusts an identity (so a
    well-formed entry would be verified); and an envelope with a real keyless entry beside a
    key verifies by the key under a keys-only keyring: neither imports sigstore-python."""
    key = make_signer()
    real = _with_key(as_extension(_bundle("0.34.0")), key)
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([[c.decode(), r] for c, r in _cases()]))
    (tmp_path / "real").write_bytes(dsse.encode(real))
    (tmp_path / "key").write_bytes(key.private.private_bytes_raw())
    code = f"""
import json, sys
from pathlib import Path
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from plancache.trust.errors import Rejected
from plancache.trust.keyring.keys import Ed25519Signer, Keyring, TrustedKey
from plancache.trust.keyring.signatories import open_envelope
from plancache.trust.keyring.trusted_keys_file import parse_trusted_keys
folder = Path({str(tmp_path)!r})
ids = parse_trusted_keys({_line("0.34.0")!r}, "t").identities.with_root(b"{{}}")
reasons = []
for data, _ in json.loads((folder / "cases.json").read_text()):
    try:
        open_envelope(data.encode(), Keyring(identities=ids))
        reasons.append("passed")
    except Rejected as exc:
        reasons.append(exc.reason.value)
signer = Ed25519Signer(Ed25519PrivateKey.from_private_bytes((folder / "key").read_bytes()))
keys = Keyring({{signer.keyid: TrustedKey(signer.keyid, "k", signer.public)}})
_, who = open_envelope((folder / "real").read_bytes(), keys)
print(json.dumps([reasons, [w.keyid for w in who]]))
print(any(m == "sigstore" or m.startswith("sigstore.") for m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    lines = out.stdout.splitlines()
    assert len(lines) == 2, out.stderr
    reasons, who = json.loads(lines[0])
    assert reasons == [r for _, r in _cases()]
    assert who == [key.keyid]
    assert lines[1] == "False"


def test_keyless_signatures_add_a_bounded_allowance_to_the_kinds_cap() -> None:
    key = make_signer()
    keyless = as_extension(_bundle("0.34.0"))
    key_only = dsse.encode(_with_key(dsse.Envelope(keyless.payload_type, keyless.payload, ()), key))
    cap = len(key_only)  # a key envelope exactly at its kind's cap
    assert open_envelope(key_only, keyring_of(key), cap)
    with pytest.raises(Rejected) as caught:
        open_envelope(key_only, keyring_of(key), cap - 1)  # a key envelope's cap: as before
    assert caught.value.reason is Reason.TOO_LARGE and f"cap is {cap - 1}" in caught.value.detail
    both = dsse.encode(_with_key(keyless, key))
    assert len(both) > cap + 8000
    _, signers = open_envelope(both, _keyring(_line("0.34.0"), key, threshold=2), cap)
    assert len(signers) == 2  # still fits: one keyless signature's allowance
    bundle = _bundle("0.34.0")
    assert len(bundle) > cap
    _, (who,) = open_envelope(bundle, _keyring(_line("0.34.0")), cap)  # so does a plain bundle
    assert who.log_index == 139993835
    with pytest.raises(Rejected) as caught:
        open_envelope(bundle, _keyring(_line("0.34.0")), cap - dsse.KEYLESS_ALLOWANCE)
    assert caught.value.reason is Reason.TOO_LARGE


def test_an_allowance_is_counted_from_the_entries_an_envelope_holds() -> None:
    """Before parsing, the bytes' ``"extension":`` names bound the allowance; after, the keyless
    entries it holds: keys named ``extension`` inside an ext buy nothing."""
    padded = {"extension": {"extension": {}}, "tlogEntries": []}
    signature = dsse.Signature("", b"s", padded)
    data = dsse.encode(dsse.Envelope(dsse.PAYLOAD_TYPE, b"p" * 30_000, (signature,)))
    assert data.count(b'"extension":') == 3
    with pytest.raises(Rejected) as caught:
        dsse.decode(data, 1000)
    assert caught.value.reason is Reason.TOO_LARGE
    assert f"cap is {1000 + dsse.KEYLESS_ALLOWANCE}" in caught.value.detail
    assert dsse.decode(data, 60_000).signatures == (signature,)  # within its one allowance


class LargeBundles:
    """A keyless signer whose bundles are ``size`` bytes (one line): the caps' arithmetic at the
    compile-cache manifest's 16 MiB, without 16 MiB through a Fulcio and a Rekor."""

    keyid = "sigstore:x"
    public = None

    def __init__(self, size: int) -> None:
        self.size = size

    def sign(self, data: bytes) -> bytes:
        raise AssertionError("keyless")

    def sign_statement(self, payload: bytes) -> bytes:
        head = b'{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json","pad":"'
        return head + b"x" * (self.size - len(head) - 3) + b'"}\n'

    def own_keyring(self) -> Keyring:
        return Keyring()


def test_a_manifest_bundle_gets_one_keyless_allowance_over_the_key_cap() -> None:
    from plancache.trust.compile_cache import manifest as mf
    from plancache.trust.compile_cache.manifest_signature import MAX_SIG_BYTES, sign_manifest

    manifest = mf.Manifest(
        "torch_aot_compile/" + "ab" * 32, (mf.FileEntry("a", 1, "0" * 64),), (), "0" * 64, 1, NOW
    )
    near = MAX_SIG_BYTES + dsse.KEYLESS_ALLOWANCE
    assert len(sign_manifest(manifest, LargeBundles(near))) == near  # type: ignore[arg-type]  # a stand-in
    with pytest.raises(Rejected) as caught:
        sign_manifest(manifest, LargeBundles(near + 1))  # type: ignore[arg-type]  # a stand-in
    assert caught.value.reason is Reason.TOO_LARGE
