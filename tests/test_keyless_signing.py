"""Keyless signing through the real protocol (issue 37 items 1-3, 6): sigstore-python's signing
client gets a certificate from a local Fulcio and logs in a local Rekor (tests/sigstore_stack.py),
plancache writes the bundle where a DSSE envelope goes, and sigstore-python's verifier checks it
offline under the stack's trust root, for every signed kind, with each failure of item 3 its
own reason."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from conftest import FP, NOW, keyring_of, make_signer, plan_bytes
from plancache.keys.keyfile import load_keyring
from plancache.keys.schemes import load_signer
from plancache.keys.sigstore_signer import KeylessSigner
from plancache.trust.compile_cache import header_statement as th
from plancache.trust.compile_cache import manifest as mf
from plancache.trust.compile_cache.manifest_signature import sign_manifest, verify_manifest
from plancache.trust.errors import ConfigError, Reason, Rejected
from plancache.trust.keyring.keys import Keyring, signer_keyring
from plancache.trust.keyring.trusted_keys_file import parse_trusted_keys
from plancache.trust.plans.plan import plan_name
from plancache.trust.plans.plan_set import build_set, verify_set
from plancache.trust.signing import sign_or_cosign, sign_plan
from plancache.trust.verify import verify_plan
from sigstore_stack import SigstoreStack

IDENTITY = "https://github.com/acme/serving/.github/workflows/bake.yml@refs/heads/main"
NAME = plan_name(FP)


@pytest.fixture(scope="module")
def stack() -> Iterator[SigstoreStack]:
    with SigstoreStack(now=NOW) as s:
        yield s


@pytest.fixture(scope="module")
def env(stack: SigstoreStack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("sigstore")
    (folder / "trust_config.json").write_bytes(stack.trust_config_bytes())
    (folder / "trusted_root.json").write_bytes(stack.trusted_root_bytes())
    return {
        "SIGSTORE_ID_TOKEN": stack.token(IDENTITY),
        "PLANCACHE_SIGSTORE_TRUST_CONFIG": str(folder / "trust_config.json"),
        "PLANCACHE_SIGSTORE_TRUSTED_ROOT": str(folder / "trusted_root.json"),
    }


@pytest.fixture(scope="module")
def keyless(env: dict[str, str]) -> KeylessSigner:
    signer = load_signer("sigstore", env)
    assert isinstance(signer, KeylessSigner)
    return signer


@pytest.fixture(scope="module")
def sidecar(keyless: KeylessSigner) -> bytes:
    return sign_plan(NAME, plan_bytes(), keyless, NOW, expires_at=NOW + timedelta(days=30))


def trusting(stack: SigstoreStack, text: str, threshold: int = 1) -> Keyring:
    keyring = parse_trusted_keys(text, "trusted").with_threshold(threshold)
    assert keyring.identities is not None
    ids = keyring.identities.with_root(stack.trusted_root_bytes())
    return Keyring(keyring.keys, keyring.revoked, keyring.threshold, ids)


def line(issuer: str, identity: str = IDENTITY, options: str = "") -> str:
    return f"{options} sigstore issuer={issuer} identity={identity}\n".lstrip()


def test_a_plan_signed_keylessly_is_a_v03_bundle_of_the_same_statement(
    stack: SigstoreStack, keyless: KeylessSigner, sidecar: bytes
) -> None:
    bundle = json.loads(sidecar)
    assert bundle["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert sidecar.endswith(b"}\n") and sidecar.count(b"\n") == 1
    payload = base64.b64decode(bundle["dsseEnvelope"]["payload"])
    assert bundle["dsseEnvelope"]["payloadType"] == "application/vnd.in-toto+json"
    key_signed = sign_plan(
        NAME, plan_bytes(), make_signer(), NOW, expires_at=NOW + timedelta(days=30)
    )
    key_payload = base64.b64decode(json.loads(key_signed)["payload"])
    assert payload == key_payload  # exactly the statement a key signs
    verified = verify_plan(NAME, plan_bytes(), sidecar, trusting(stack, line(stack.issuer)), NOW)
    (who,) = verified.identities
    assert (who.identity, who.issuer) == (IDENTITY, stack.issuer)
    assert who.log_index >= 5 and verified.signers == (IDENTITY,)
    assert verified.key_ids == ("sigstore:" + IDENTITY,)


def test_the_keyring_file_pins_the_root_from_the_environment(
    stack: SigstoreStack,
    env: dict[str, str],
    sidecar: bytes,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "trusted"
    path.write_text(line(stack.issuer))
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUSTED_ROOT", env["PLANCACHE_SIGSTORE_TRUSTED_ROOT"])
    keyring = load_keyring(path)
    assert keyring.identities is not None and not keyring.keys
    assert keyring.identities.trusted_root == stack.trusted_root_bytes()
    assert verify_plan(NAME, plan_bytes(), sidecar, keyring, NOW).identities
    monkeypatch.delenv("PLANCACHE_SIGSTORE_TRUSTED_ROOT")  # the public-good root: foreign here
    with pytest.raises(Rejected) as caught:
        verify_plan(NAME, plan_bytes(), sidecar, load_keyring(path), NOW)
    assert caught.value.reason is Reason.FOREIGN_TRUST_ROOT


def test_sign_or_cosign_signs_keeps_and_co_signs_a_bundle(
    stack: SigstoreStack, keyless: KeylessSigner, sidecar: bytes
) -> None:
    action, fresh = sign_or_cosign(NAME, plan_bytes(), None, keyless, NOW, keyring=None)
    assert action == "signed" and json.loads(fresh)["mediaType"].startswith("application/vnd.dev")
    action, kept = sign_or_cosign(NAME, plan_bytes(), fresh, keyless, NOW, keyring=None)
    assert (action, kept) == ("kept", fresh)
    key = make_signer()
    keyring = trusting(stack, line(stack.issuer))
    action, both = sign_or_cosign(NAME, plan_bytes(), fresh, key, NOW, keyring=keyring)
    assert action == "co-signed"  # a bundle and a key: one envelope holding both
    envelope = json.loads(both)
    assert [bool(s["keyid"]) for s in envelope["signatures"]] == [False, True]
    assert envelope["payload"] == json.loads(fresh)["dsseEnvelope"]["payload"]
    two = keyring.merged(keyring_of(key)).with_threshold(2)
    assert len(verify_plan(NAME, plan_bytes(), both, two, NOW).signers) == 2
    action, _ = sign_or_cosign(NAME, plan_bytes(), fresh, key, NOW, keyring=keyring, replace=True)
    assert action == "co-signed"  # --replace only where adopting fails


def test_plan_sets_manifests_and_headers_take_bundles_too(
    stack: SigstoreStack, keyless: KeylessSigner
) -> None:
    keyring = trusting(stack, line(stack.issuer))
    key = make_signer()
    member = sign_plan(NAME, plan_bytes(), key, NOW)
    name, data = build_set([(FP, plan_bytes(), member)], keyless, NOW)
    both = keyring.merged(keyring_of(key))
    verified = verify_set(name, data, both, NOW)
    assert verified.signers == (IDENTITY,)
    subject = "torch_aot_compile/" + "ab" * 32
    manifest = mf.Manifest(subject, (mf.FileEntry("a", 1, "0" * 64),), (), "0" * 64, 1, NOW)
    sig = sign_manifest(manifest, keyless)
    assert verify_manifest(subject, sig, keyring, NOW).signers == (IDENTITY,)
    assert verify_manifest(subject, sig, signer_keyring(keyless), NOW).signers
    entry = th.HeaderEntry("cabcdefghijklmnop0123456789.h.gch", 10, "1" * 64)
    hset = th.HeaderSet(subject, (entry,), "2" * 64, 1 << 20, NOW, cache_archive_sha256="3" * 64)
    sig = th.sign_headers(hset, keyless)
    headers = th.verify_headers(subject, sig, keyring, NOW, cache_archive_sha256="3" * 64)
    assert headers.signers == (IDENTITY,)


def _tampered(sidecar: bytes, change: Any) -> bytes:
    bundle = json.loads(sidecar)
    change(bundle)
    return json.dumps(bundle).encode() + b"\n"


def _entry(bundle: dict[str, Any]) -> dict[str, Any]:
    return bundle["verificationMaterial"]["tlogEntries"][0]


def _flip_proof_hash(bundle: dict[str, Any]) -> None:
    hashes = _entry(bundle)["inclusionProof"]["hashes"]
    hashes[0] = base64.b64encode(bytes(32)).decode()


def _forge_checkpoint(bundle: dict[str, Any]) -> None:
    proof = _entry(bundle)["inclusionProof"]
    note, _, sig = proof["checkpoint"]["envelope"].rpartition(" ")
    raw = bytearray(base64.b64decode(sig))
    raw[-1] ^= 1
    proof["checkpoint"]["envelope"] = f"{note} {base64.b64encode(bytes(raw)).decode()}\n"


def _forge_set(bundle: dict[str, Any]) -> None:
    promise = _entry(bundle)["inclusionPromise"]
    raw = bytearray(base64.b64decode(promise["signedEntryTimestamp"]))
    raw[-1] ^= 1
    promise["signedEntryTimestamp"] = base64.b64encode(bytes(raw)).decode()


def _alter_payload(bundle: dict[str, Any]) -> None:
    payload = base64.b64decode(bundle["dsseEnvelope"]["payload"]).replace(b"2026", b"2025", 1)
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(payload).decode()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda b: _entry(b).pop("inclusionProof"), Reason.NO_LOG_PROOF),
        (lambda b: b["verificationMaterial"].pop("tlogEntries"), Reason.NO_LOG_PROOF),
        (lambda b: _entry(b).pop("inclusionPromise"), Reason.NO_LOG_PROOF),
        (_flip_proof_hash, Reason.BAD_LOG_PROOF),
        (_forge_checkpoint, Reason.BAD_LOG_PROOF),
        (_forge_set, Reason.BAD_LOG_PROOF),
        (_alter_payload, Reason.BAD_SIGNATURE),
        (
            lambda b: b.update(mediaType="application/vnd.dev.sigstore.bundle+json;version=0.2"),
            Reason.MALFORMED,
        ),
        (lambda b: b["dsseEnvelope"].update(payloadType="text/plain"), Reason.MALFORMED),
    ],
)
def test_a_tampered_bundle_is_refused_with_its_reason(
    stack: SigstoreStack, sidecar: bytes, change: Any, reason: Reason
) -> None:
    keyring = trusting(stack, line(stack.issuer))
    with pytest.raises(Rejected) as caught:
        verify_plan(NAME, plan_bytes(), _tampered(sidecar, change), keyring, NOW)
    assert caught.value.reason is reason, caught.value


@pytest.mark.parametrize(
    ("trusted", "threshold", "reason"),
    [
        (lambda s: line("https://token.actions.githubusercontent.com"), 1, Reason.WRONG_ISSUER),
        (lambda s: line(s.issuer, IDENTITY.replace("main", "dev")), 1, Reason.WRONG_IDENTITY),
        (
            lambda s: line(s.issuer, "acme/serving", "").replace("identity=", "identity-regexp="),
            1,
            Reason.UNANCHORED_IDENTITY,
        ),
        (  # an exact line is anchored: a SAN it is only part of is another identity
            lambda s: line(s.issuer, IDENTITY.removesuffix("@refs/heads/main")),
            1,
            Reason.WRONG_IDENTITY,
        ),
        (lambda s: line(s.issuer) + "@revoked " + line(s.issuer), 1, Reason.REVOKED),
        (lambda s: line(s.issuer, options="valid-before=2026-11-01T00:00:00Z"), 1, Reason.EXPIRED),
        (lambda s: line(s.issuer, options="valid-after=2026-12-01T00:00:00Z"), 1, Reason.EXPIRED),
        (lambda s: line(s.issuer), 2, Reason.THRESHOLD),
        (
            lambda s: (
                "ssh-ed25519 "
                "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl x\n"
            ),
            1,
            Reason.UNTRUSTED_KEY,
        ),
    ],
)
def test_each_identity_rule_is_its_own_reason(
    stack: SigstoreStack, sidecar: bytes, trusted: Any, threshold: int, reason: Reason
) -> None:
    keyring = (
        trusting(stack, trusted(stack), threshold)
        if "sigstore" in trusted(stack)
        else (parse_trusted_keys(trusted(stack), "keys"))
    )
    with pytest.raises(Rejected) as caught:
        verify_plan(NAME, plan_bytes(), sidecar, keyring, NOW)
    assert caught.value.reason is reason, caught.value


def test_a_foreign_instance_is_a_foreign_trust_root(stack: SigstoreStack, sidecar: bytes) -> None:
    with SigstoreStack(now=NOW) as other:
        keyring = trusting(other, line(stack.issuer))
        with pytest.raises(Rejected) as caught:
            verify_plan(NAME, plan_bytes(), sidecar, keyring, NOW)
    assert caught.value.reason is Reason.FOREIGN_TRUST_ROOT


def test_a_log_time_outside_the_certificate_is_its_own_reason(tmp_path: Path) -> None:
    with SigstoreStack() as skewed:
        skewed.log_time_shift = timedelta(minutes=30)  # the log's clock, signed all the same
        (tmp_path / "cfg.json").write_bytes(skewed.trust_config_bytes())
        env = {
            "SIGSTORE_ID_TOKEN": skewed.token(IDENTITY),
            "PLANCACHE_SIGSTORE_TRUST_CONFIG": str(tmp_path / "cfg.json"),
        }
        sidecar = sign_plan(NAME, plan_bytes(), load_signer("sigstore", env), NOW)
        with pytest.raises(Rejected) as caught:
            verify_plan(NAME, plan_bytes(), sidecar, trusting(skewed, line(skewed.issuer)), NOW)
    assert caught.value.reason is Reason.CERT_OUTSIDE_VALIDITY


def test_a_forged_or_missing_token_is_a_config_error(
    stack: SigstoreStack, env: dict[str, str]
) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    forged = stack.token(IDENTITY, key=ec.generate_private_key(ec.SECP256R1()))
    before = stack.rekor_requests
    signer = load_signer("sigstore", {**env, "SIGSTORE_ID_TOKEN": forged})
    with pytest.raises(ConfigError) as caught:
        sign_plan(NAME, plan_bytes(), signer, NOW)
    assert "sigstore signing failed" in caught.value.detail and forged not in caught.value.detail
    assert stack.rekor_requests == before  # nothing logged without a certificate
    with pytest.raises(ConfigError) as caught:
        load_signer("sigstore", {**env, "SIGSTORE_ID_TOKEN": stack.token(IDENTITY, audience="x")})
    assert "OIDC token from SIGSTORE_ID_TOKEN" in caught.value.detail
    bare = {k: v for k, v in env.items() if k != "SIGSTORE_ID_TOKEN"}
    with pytest.raises(ConfigError) as caught:
        load_signer("sigstore", bare)
    assert "no OIDC token" in caught.value.detail


def test_the_signers_own_check_trusts_the_certified_identity_not_the_tokens_claim(
    stack: SigstoreStack, env: dict[str, str]
) -> None:
    """GitHub's tokens name ``repo:…`` in ``sub`` while Fulcio certifies the workflow's URL:
    signing checks its result against what the certificate says."""
    token = stack.token(
        "repo:acme/serving:ref:refs/heads/main",
        job_workflow_ref="acme/serving/.github/workflows/bake.yml@refs/heads/main",
    )
    signer = load_signer("sigstore", {**env, "SIGSTORE_ID_TOKEN": token})
    action, sidecar = sign_or_cosign(NAME, plan_bytes(), None, signer, NOW, keyring=None)
    assert action == "signed"
    verified = verify_plan(NAME, plan_bytes(), sidecar, trusting(stack, line(stack.issuer)), NOW)
    assert verified.identities[0].identity == IDENTITY


def test_an_identity_token_is_never_shown(stack: SigstoreStack) -> None:
    from plancache.trust.display import safe_text

    token = stack.token(IDENTITY)
    shown = safe_text(f"Fulcio said: bad token {token} (Authorization: Bearer {token})", 1000)
    assert token not in shown and token.split(".")[1] not in shown and "***" in shown


def test_the_identity_token_file_is_read(
    stack: SigstoreStack, env: dict[str, str], tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text(stack.token(IDENTITY) + "\n")
    bare = {k: v for k, v in env.items() if k != "SIGSTORE_ID_TOKEN"}
    signer = load_signer("sigstore", {**bare, "PLANCACHE_SIGSTORE_IDENTITY_TOKEN_FILE": str(token)})
    assert signer.keyid == "sigstore:" + IDENTITY


@pytest.mark.parametrize(
    "text",
    [
        "sigstore identity=x\n",
        "sigstore issuer=a identity=x identity-regexp=y\n",
        "sigstore issuer=a identity-regexp=(\n",
        "sigstore issuer=a identity=x colour=blue\n",
        "sigstore issuer=a identity=x\nsigstore issuer=a identity=x\n",
        "valid-after=2027-01-01T00:00:00Z,valid-before=2026-01-01T00:00:00Z "
        "sigstore issuer=a identity=x\n",
    ],
)
def test_an_identity_line_that_does_not_parse_names_its_line(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_trusted_keys(text, "trusted")
    assert caught.value.detail.startswith("trusted:")


def test_a_keys_only_keyring_never_imports_sigstore(tmp_path: Path) -> None:
    """The plugin's import and a keys-only verify stay as light as before (item 4)."""
    code = (
        "import sys, plancache.vllm_plugin, plancache.trust.verify, plancache.keys.schemes;"
        "print(any(m == 'sigstore' or m.startswith('sigstore.') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_a_bundle_against_keys_only_is_untrusted_not_malformed(sidecar: bytes) -> None:
    keyring = keyring_of(make_signer())
    with pytest.raises(Rejected) as caught:
        verify_plan(NAME, plan_bytes(), sidecar, keyring, NOW)
    assert caught.value.reason is Reason.UNTRUSTED_KEY
    assert replace(keyring).identities is None
