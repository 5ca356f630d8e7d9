"""Thresholds above 1 with keyless signatures (issue 37): keys and Sigstore identities counted
together in one DSSE envelope (signature extensions), through sigstore-python's real client
and verifier and the local Fulcio/Rekor (tests/sigstore_stack.py). Each trusted identity line
counts once; an untrusted or revoked identity's signature never counts; an extension moved
under another payload or log entry fails. Every signed kind takes them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from cli_support import run
from conftest import FP, NOW, keyring_of, make_signer, plan_bytes
from plancache.keys.keyfile import generate_keypair
from plancache.keys.schemes import load_signer
from plancache.keys.sigstore_signer import KeylessSigner
from plancache.pipeline.keyless_report import signers_of
from plancache.storage.local.localdir import LocalPlanDir
from plancache.trust import envelope as dsse
from plancache.trust.compile_cache import header_statement as th
from plancache.trust.compile_cache import manifest as mf
from plancache.trust.compile_cache.manifest_signature import sign_manifest, verify_manifest
from plancache.trust.envelope import is_bundle
from plancache.trust.errors import ConfigError, Reason, Rejected
from plancache.trust.keyless.dsse_extension import as_extension
from plancache.trust.keyring.keys import Ed25519Signer, Keyring
from plancache.trust.keyring.trusted_keys_file import parse_trusted_keys
from plancache.trust.plans.plan import plan_name
from plancache.trust.plans.plan_set import build_set, split_set, verify_set
from plancache.trust.signing import add_signature, sign_or_cosign, sign_plan
from plancache.trust.verify import verify_plan
from sigstore_stack import SigstoreStack

IDENTITY = "https://github.com/acme/serving/.github/workflows/bake.yml@refs/heads/main"
OTHER = "https://github.com/acme/serving/.github/workflows/release.yml@refs/heads/main"
NAME = plan_name(FP)
LATER = NOW + timedelta(days=30)


@dataclass
class Signers:
    stack: SigstoreStack
    key: Ed25519Signer
    bake: KeylessSigner
    release: KeylessSigner


@pytest.fixture(scope="module")
def signers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Signers]:
    with SigstoreStack(now=NOW) as stack:
        config = tmp_path_factory.mktemp("sigstore") / "trust_config.json"
        config.write_bytes(stack.trust_config_bytes())

        def keyless(identity: str) -> KeylessSigner:
            env = {
                "SIGSTORE_ID_TOKEN": stack.token(identity),
                "PLANCACHE_SIGSTORE_TRUST_CONFIG": str(config),
            }
            signer = load_signer("sigstore", env)
            assert isinstance(signer, KeylessSigner)
            return signer

        yield Signers(stack, make_signer(), keyless(IDENTITY), keyless(OTHER))


@pytest.fixture(scope="module")
def sidecar(signers: Signers) -> bytes:
    """Plan FP signed by the key: the statement every signature below is over."""
    return sign_plan(NAME, plan_bytes(), signers.key, NOW, expires_at=LATER)


def payload_of(sig: bytes) -> bytes:
    return dsse.decode(sig, dsse.MAX_SIG_BYTES).payload


@pytest.fixture(scope="module")
def bundles(signers: Signers, sidecar: bytes) -> dict[str, bytes]:
    """Keyless signatures over the sidecar's statement: bake twice, release once (signed once
    per module: each is a Fulcio certificate and a Rekor entry)."""
    payload = payload_of(sidecar)
    return {
        "bake": signers.bake.sign_statement(payload),
        "bake-again": signers.bake.sign_statement(payload),
        "release": signers.release.sign_statement(payload),
    }


def with_keyless(sig: bytes, *bundles: bytes) -> bytes:
    """``sig`` (an envelope) with each bundle's signature added as an extension entry."""
    env = dsse.decode(sig, dsse.MAX_SIG_BYTES)
    entries = list(env.signatures)
    for bundle in bundles:
        extension = as_extension(bundle)
        assert extension.payload == env.payload
        entries += extension.signatures
    return dsse.encode(dsse.Envelope(env.payload_type, env.payload, tuple(entries)))


def only_keyless(*bundles: bytes) -> bytes:
    first = as_extension(bundles[0])
    entries = [s for b in bundles for s in as_extension(b).signatures]
    return dsse.encode(dsse.Envelope(first.payload_type, first.payload, tuple(entries)))


def trusting(signers: Signers, lines: str, *keys: Ed25519Signer, threshold: int = 1) -> Keyring:
    ids = parse_trusted_keys(lines, "trusted").identities
    assert ids is not None
    root = signers.stack.trusted_root_bytes()
    return Keyring(keyring_of(*keys).keys, frozenset(), threshold, ids.with_root(root))


def line(signers: Signers, identity: str = IDENTITY) -> str:
    return f"sigstore issuer={signers.stack.issuer} identity={identity}\n"


def refused(reason: Reason, sig: bytes, keyring: Keyring) -> Rejected:
    with pytest.raises(Rejected) as caught:
        verify_plan(NAME, plan_bytes(), sig, keyring, NOW)
    assert caught.value.reason is reason, caught.value
    return caught.value


def test_a_key_and_an_identity_meet_a_threshold_of_two(
    signers: Signers, sidecar: bytes, bundles: dict[str, bytes]
) -> None:
    both = with_keyless(sidecar, bundles["bake"])
    keyring = trusting(signers, line(signers), signers.key, threshold=2)
    verified = verify_plan(NAME, plan_bytes(), both, keyring, NOW)
    assert verified.key_ids == (signers.key.keyid, "sigstore:" + IDENTITY)
    assert verified.signers == ("key0", IDENTITY)
    (who,) = verified.identities
    assert (who.issuer, who.log_index >= 5) == (signers.stack.issuer, True)
    refused(Reason.THRESHOLD, sidecar, keyring)  # the key alone: one of two
    refused(Reason.THRESHOLD, bundles["bake"], keyring)  # the bundle alone: one of two


def test_two_identities_meet_a_threshold_of_two(
    signers: Signers, bundles: dict[str, bytes]
) -> None:
    both = only_keyless(bundles["bake"], bundles["release"])
    keyring = trusting(signers, line(signers) + line(signers, OTHER), threshold=2)
    verified = verify_plan(NAME, plan_bytes(), both, keyring, NOW)
    assert {w.identity for w in verified.identities} == {IDENTITY, OTHER}


def test_one_identity_line_counts_once(signers: Signers, bundles: dict[str, bytes]) -> None:
    twice = only_keyless(bundles["bake"], bundles["bake-again"])
    refused(Reason.THRESHOLD, twice, trusting(signers, line(signers), threshold=2))
    verified = verify_plan(NAME, plan_bytes(), twice, trusting(signers, line(signers)), NOW)
    assert verified.signers == (IDENTITY,)
    both = only_keyless(bundles["bake"], bundles["release"])
    every_workflow = (
        f"sigstore issuer={signers.stack.issuer} "
        r"identity-regexp=https://github\.com/acme/serving/\.github/workflows/[a-z]+\.yml"
        "@refs/heads/main\n"
    )
    err = refused(Reason.THRESHOLD, both, trusting(signers, every_workflow, threshold=2))
    assert "1 trusted key(s) signed, 2 required" in err.detail


def test_an_untrusted_or_revoked_identity_never_counts(
    signers: Signers, sidecar: bytes, bundles: dict[str, bytes]
) -> None:
    both = with_keyless(sidecar, bundles["release"])
    only_bake = trusting(signers, line(signers), signers.key)
    assert verify_plan(NAME, plan_bytes(), both, only_bake, NOW).signers == ("key0",)
    refused(Reason.THRESHOLD, both, only_bake.with_threshold(2))
    refused(Reason.WRONG_IDENTITY, only_keyless(bundles["release"]), only_bake)
    revoked = line(signers, OTHER) + "@revoked " + line(signers, OTHER)
    keyring = trusting(signers, revoked, signers.key)
    assert verify_plan(NAME, plan_bytes(), both, keyring, NOW).signers == ("key0",)
    refused(Reason.THRESHOLD, both, keyring.with_threshold(2))
    refused(Reason.REVOKED, only_keyless(bundles["release"]), keyring)


def test_an_extension_moved_under_another_payload_or_log_entry_fails(
    signers: Signers, sidecar: bytes, bundles: dict[str, bytes]
) -> None:
    keyring = trusting(signers, line(signers) + line(signers, OTHER))
    other_plan = plan_bytes(kv=1)
    other = sign_plan(NAME, other_plan, signers.key, NOW)
    moved = dsse.decode(other)
    entry = as_extension(bundles["bake"]).signatures[0]
    moved_entry = dsse.Envelope(moved.payload_type, moved.payload, (entry,))
    with pytest.raises(Rejected) as caught:
        verify_plan(NAME, other_plan, dsse.encode(moved_entry), keyring, NOW)
    assert caught.value.reason is Reason.BAD_SIGNATURE
    # the release signature and certificate, with the bake signature's log entry
    release, bake = as_extension(bundles["release"]), as_extension(bundles["bake"])
    assert release.signatures[0].ext is not None and bake.signatures[0].ext is not None
    ext = {**release.signatures[0].ext, "tlogEntries": bake.signatures[0].ext["tlogEntries"]}
    swapped = dsse.Signature("", release.signatures[0].sig, ext)
    lying = dsse.encode(dsse.Envelope(release.payload_type, release.payload, (swapped,)))
    refused(Reason.BAD_LOG_PROOF, lying, keyring)
    key = dsse.decode(sidecar).signatures[0]
    with_key = dsse.Envelope(release.payload_type, release.payload, (swapped, key))
    keyring = trusting(signers, line(signers, OTHER), signers.key)
    assert verify_plan(NAME, plan_bytes(), dsse.encode(with_key), keyring, NOW).signers == ("key0",)
    refused(Reason.THRESHOLD, dsse.encode(with_key), keyring.with_threshold(2))


def _junk_in_certificate(ext: dict[str, Any]) -> None:
    raw = ext["certificate"]["rawBytes"]
    ext["certificate"]["rawBytes"] = raw[:12] + "!" + raw[12:]  # sigstore-python drops the "!"


def _zero_before_log_index(ext: dict[str, Any]) -> None:
    entry = ext["tlogEntries"][0]
    entry["logIndex"] = "0" + entry["logIndex"]  # int() reads "0139" as 139


@pytest.mark.parametrize("respell", [_junk_in_certificate, _zero_before_log_index])
def test_a_keyless_entry_spelt_another_way_is_malformed(
    signers: Signers, sidecar: bytes, bundles: dict[str, bytes], respell: Callable[..., None]
) -> None:
    """The envelope is canonical, and so must a keyless entry's ``ext`` be: sigstore-python reads
    its base64 and its integers leniently, so a respelt ``ext`` verified as the same signature
    (one keyless signature, many envelopes that all verify: every byte of a counted signature
    must matter, SECURITY.md)."""
    keyring = trusting(signers, line(signers))
    genuine = with_keyless(sidecar, bundles["bake"])
    assert verify_plan(NAME, plan_bytes(), genuine, keyring, NOW).signers == (IDENTITY,)
    env = dsse.decode(genuine)
    key, keyless = env.signatures
    assert keyless.ext is not None
    ext = json.loads(json.dumps(keyless.ext))
    respell(ext)
    respelt = dsse.encode(
        dsse.Envelope(env.payload_type, env.payload, (key, dsse.Signature("", keyless.sig, ext)))
    )
    assert respelt != genuine and dsse.decode(respelt).signatures[1].ext == ext  # canonical
    refused(Reason.MALFORMED, respelt, keyring)


def test_plan_sets_manifests_and_headers_take_extension_signatures(
    signers: Signers, sidecar: bytes, bundles: dict[str, bytes]
) -> None:
    keyring = trusting(signers, line(signers), signers.key, threshold=2)
    member = with_keyless(sidecar, bundles["bake"])
    name, data = build_set([(FP, plan_bytes(), member)], signers.key, NOW)
    head, body = split_set(data)
    cosigned = with_keyless(head, signers.bake.sign_statement(payload_of(head)))
    assert verify_set(name, cosigned + body, keyring, NOW).signers == ("key0", IDENTITY)
    with pytest.raises(Rejected) as caught:
        verify_set(name, data, keyring, NOW)
    assert caught.value.reason is Reason.THRESHOLD
    subject = "torch_aot_compile/" + "ab" * 32
    manifest = mf.Manifest(subject, (mf.FileEntry("a", 1, "0" * 64),), (), "0" * 64, 1, NOW)
    sig = sign_manifest(manifest, signers.key)
    sig = with_keyless(sig, signers.bake.sign_statement(payload_of(sig)))
    assert verify_manifest(subject, sig, keyring, NOW).signers == ("key0", IDENTITY)
    entry = th.HeaderEntry("cabcdefghijklmnop0123456789.h.gch", 10, "1" * 64)
    hset = th.HeaderSet(subject, (entry,), "2" * 64, 1 << 20, NOW, cache_archive_sha256="3" * 64)
    sig = th.sign_headers(hset, signers.key)
    sig = with_keyless(sig, signers.bake.sign_statement(payload_of(sig)))
    headers = th.verify_headers(subject, sig, keyring, NOW, cache_archive_sha256="3" * 64)
    assert headers.signers == ("key0", IDENTITY)


# -- co-signing: sign_or_cosign and `plancache sign` -----------------------------------------


def test_an_identity_co_signs_a_key_signed_plan_towards_two(
    signers: Signers, sidecar: bytes
) -> None:
    vouching = keyring_of(signers.key)  # the trusted keys that vouch for the statement
    action, both = sign_or_cosign(
        NAME, plan_bytes(), sidecar, signers.bake, NOW, keyring=vouching, expires_at=LATER
    )
    assert action == "co-signed" and payload_of(both) == payload_of(sidecar)
    keyring = trusting(signers, line(signers), signers.key, threshold=2)
    verified = verify_plan(NAME, plan_bytes(), both, keyring, NOW)
    assert verified.key_ids == (signers.key.keyid, "sigstore:" + IDENTITY)
    facts = signers_of(verified)  # what the boot records and reports name
    assert facts[0] == {"name": "key0", "keyid": signers.key.keyid}
    assert (facts[1]["identity"], facts[1]["issuer"]) == (IDENTITY, signers.stack.issuer)
    assert isinstance(facts[1]["log_index"], int)
    requests = signers.stack.rekor_requests
    assert sign_or_cosign(NAME, plan_bytes(), both, signers.bake, NOW, keyring=vouching) == (
        "kept",
        both,
    )
    assert sign_or_cosign(NAME, plan_bytes(), both, signers.key, NOW, keyring=None) == (
        "kept",
        both,
    )
    assert signers.stack.rekor_requests == requests  # kept: nothing signed, nothing logged


def test_a_bundle_co_signed_by_another_identity_is_one_envelope(
    signers: Signers, bundles: dict[str, bytes]
) -> None:
    vouching = trusting(signers, line(signers))
    action, both = sign_or_cosign(
        NAME, plan_bytes(), bundles["bake"], signers.release, NOW, keyring=vouching
    )
    assert action == "co-signed" and not is_bundle(both)
    keyring = trusting(signers, line(signers) + line(signers, OTHER), threshold=2)
    verified = verify_plan(NAME, plan_bytes(), both, keyring, NOW)
    assert [w.identity for w in verified.identities] == [IDENTITY, OTHER]
    action, three = sign_or_cosign(NAME, plan_bytes(), both, signers.key, NOW, keyring=vouching)
    assert action == "co-signed"
    three_ways = trusting(signers, line(signers) + line(signers, OTHER), signers.key, threshold=3)
    assert len(verify_plan(NAME, plan_bytes(), three, three_ways, NOW).signers) == 3


def test_a_statement_no_trusted_signer_vouches_for_is_not_co_signed(
    signers: Signers, bundles: dict[str, bytes]
) -> None:
    """The release identity's statement, while only the key and the bake identity are trusted:
    refused, whoever co-signs."""
    keyring = trusting(signers, line(signers), signers.key)
    for signer in (signers.bake, signers.key):
        with pytest.raises(Rejected) as caught:
            sign_or_cosign(NAME, plan_bytes(), bundles["release"], signer, NOW, keyring=keyring)
        assert caught.value.reason is Reason.WRONG_IDENTITY
        assert caught.value.detail.startswith("cannot co-sign: ")


def test_a_revoked_identity_does_not_sign(signers: Signers, sidecar: bytes) -> None:
    revoked = line(signers) + "@revoked " + line(signers)
    keyring = trusting(signers, revoked, signers.key)
    with pytest.raises(ConfigError) as caught:
        sign_or_cosign(NAME, plan_bytes(), sidecar, signers.bake, NOW, keyring=keyring)
    assert "revoked" in caught.value.detail


@dataclass(frozen=True)
class OtherBytes:
    """A keyless signer whose bundle is over other bytes than it was handed."""

    inner: KeylessSigner

    @property
    def keyid(self) -> str:
        return self.inner.keyid

    @property
    def public(self) -> Any:
        return self.inner.public

    def sign(self, data: bytes) -> bytes:
        return self.inner.sign(data)

    def sign_statement(self, payload: bytes) -> bytes:
        return self.inner.sign_statement(payload.replace(b"2026", b"2025", 1))

    def own_keyring(self) -> Keyring:
        return self.inner.own_keyring()


def test_a_bundle_over_other_bytes_is_not_merged(signers: Signers, sidecar: bytes) -> None:
    with pytest.raises(ConfigError) as caught:
        add_signature(NAME, plan_bytes(), sidecar, OtherBytes(signers.bake))
    assert "other bytes" in caught.value.detail


def test_sign_cosigns_a_directory_keylessly_and_verify_lists_both(
    capsys: pytest.CaptureFixture[str],
    signers: Signers,
    plan_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``plancache sign --key sigstore`` over a key-signed directory, then ``verify --threshold
    2 --json`` naming both signers (the keyless one with its identity, issuer, log index)."""
    LocalPlanDir(plan_dir).write(FP, plan_bytes(), None)
    generate_keypair(tmp_path / "ci", force=False, comment="ci")
    stack = signers.stack
    monkeypatch.setattr(stack, "fixed_now", None)  # the CLI signs at the real clock's time
    (tmp_path / "config.json").write_bytes(stack.trust_config_bytes())
    (tmp_path / "root.json").write_bytes(stack.trusted_root_bytes())
    (tmp_path / "token").write_text(stack.token(IDENTITY))
    (tmp_path / "trusted").write_text((tmp_path / "ci.pub").read_text() + line(signers))
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUST_CONFIG", str(tmp_path / "config.json"))
    for name in ("SIGSTORE_ID_TOKEN", "PLANCACHE_SIGSTORE_TRUSTED_ROOT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PLANCACHE_SIGSTORE_IDENTITY_TOKEN_FILE", "")  # the CLI sets them
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUSTED_ROOT", "")
    code, _, err = run(capsys, "sign", "--key", str(tmp_path / "ci"), str(plan_dir))
    assert code == 0 and "1 signed" in err, err
    code, out, err = run(
        capsys,
        "sign",
        *("--key", "sigstore", "--identity-token", str(tmp_path / "token")),
        *("--trusted-keys", str(tmp_path / "ci.pub"), "--json", str(plan_dir)),
    )
    assert code == 0 and json.loads(out)["plans"][0]["action"] == "co-signed", out + err
    trust = (
        "--trusted-keys",
        str(tmp_path / "trusted"),
        "--trusted-root",
        str(tmp_path / "root.json"),
    )
    code, out, err = run(capsys, "verify", *trust, "--threshold", "2", "--json", str(plan_dir))
    (plan,) = json.loads(out)["plans"]
    assert code == 0 and plan["status"] == "valid", out + err
    key, keyless = plan["signed_by"]
    assert key["name"] == "ci" and "identity" not in key
    assert (keyless["identity"], keyless["issuer"]) == (IDENTITY, stack.issuer)
    assert isinstance(keyless["log_index"], int) and keyless["log_index"] >= 5
    code, out, _ = run(capsys, "verify", *trust, "--threshold", "3", "--json", str(plan_dir))
    assert code == 1 and json.loads(out)["plans"][0]["reason"] == "threshold-not-met"
    code, out, _ = run(capsys, "ls", *trust, "--json", str(plan_dir))
    assert code == 0 and len(json.loads(out)["plans"][0]["signed_by"]) == 2
    code, out, _ = run(capsys, "ls", "--json", str(plan_dir))  # no keys: claimed, unverified
    assert code == 0 and "sigstore (unverified)" in json.loads(out)["plans"][0]["signer_ids"]


@pytest.mark.parametrize(
    ("later", "counts"),
    [(timedelta(days=1), True), (-timedelta(days=1), False)],
)
def test_an_identity_that_co_signs_a_key_signed_statement_later_counts(
    signers: Signers, sidecar: bytes, tmp_path: Path, later: timedelta, counts: bool
) -> None:
    """docs/keys.md's order "key first, then the job": the key dated the statement, the job
    co-signs it a day later; its verified time is its own, the date is the key's (red team
    48a: ``signing-time-mismatch``, even at a threshold of one that the key alone met). An
    identity logged a day *before* the statement's date still did not sign it then: a
    forward-dated statement stays ``signing-time-mismatch``."""
    with SigstoreStack(now=NOW + later) as stack:
        config = tmp_path / "trust_config.json"
        config.write_bytes(stack.trust_config_bytes())
        env = {
            "SIGSTORE_ID_TOKEN": stack.token(IDENTITY),
            "PLANCACHE_SIGSTORE_TRUST_CONFIG": str(config),
        }
        job = load_signer("sigstore", env)
        assert isinstance(job, KeylessSigner)
        cosigned = with_keyless(sidecar, job.sign_statement(payload_of(sidecar)))
        ids = parse_trusted_keys(f"sigstore issuer={stack.issuer} identity={IDENTITY}\n", "t")
        assert ids.identities is not None
        policy = ids.identities.with_root(stack.trusted_root_bytes())
    when = max(NOW, NOW + later) + timedelta(minutes=1)
    for threshold in (1, 2):
        keyring = Keyring(keyring_of(signers.key).keys, frozenset(), threshold, policy)
        if counts:
            verified = verify_plan(NAME, plan_bytes(), cosigned, keyring, when)
            assert len(verified.signers) == 2, verified
        else:
            with pytest.raises(Rejected) as caught:
                verify_plan(NAME, plan_bytes(), cosigned, keyring, when)
            assert caught.value.reason is Reason.SIGNING_TIME_MISMATCH, caught.value


def test_an_identity_that_signed_twice_counts_by_its_first_signature_in_any_order(
    signers: Signers, sidecar: bytes, bundles: dict[str, bytes]
) -> None:
    """The bake job signed the statement when it was dated and again a day later: the line
    counts once, by its first signature, whichever entry comes first (red team 48a: with the
    later entry first the verdict was ``signing-time-mismatch``; the envelope's order is not
    signed, so a store could flip it)."""
    signers.stack.fixed_now = NOW + timedelta(days=1)
    try:
        late = signers.bake.sign_statement(payload_of(sidecar))
    finally:
        signers.stack.fixed_now = NOW
    keyring = trusting(signers, line(signers))
    when = NOW + timedelta(days=1, minutes=1)
    for order in ((bundles["bake"], late), (late, bundles["bake"])):
        verified = verify_plan(NAME, plan_bytes(), only_keyless(*order), keyring, when)
        assert verified.signers == (IDENTITY,), verified
