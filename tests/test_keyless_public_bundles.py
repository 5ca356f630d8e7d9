"""Real Sigstore bundles (tests/data/sigstore/README.md) verified offline by plancache's bundle
verifier against the trust roots shipped in the pinned sigstore-python wheel: the format and
the identity rules proven against the real public-good service, not only our local stack."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import pytest

from plancache.keys.sigstore_root import public_good_root
from plancache.trust.errors import Reason, Rejected
from plancache.trust.keyless.sigstore_bundle import open_bundle
from plancache.trust.keyring.trusted_keys_file import parse_trusted_keys

DATA = Path(__file__).parent / "data" / "sigstore"
GITHUB = "https://token.actions.githubusercontent.com"
WORKFLOW = "https://github.com/terraform-linters/tflint-ruleset-aws/.github/workflows/release.yml"
CAP = 64 * 1024


def _bundle(version: str) -> bytes:
    return (DATA / f"public-good-github-tflint-ruleset-aws-v{version}.sigstore.json").read_bytes()


def _policy(lines: str, root: bytes | None = None):
    ids = parse_trusted_keys(lines, "trusted").identities
    assert ids is not None
    return ids.with_root(root if root is not None else public_good_root())


@pytest.mark.parametrize(("version", "index"), [("0.34.0", 139993835), ("0.35.0", 149329939)])
def test_a_public_good_bundle_verifies_offline_and_names_its_signer(
    version: str, index: int
) -> None:
    policy = _policy(f"sigstore issuer={GITHUB} identity={WORKFLOW}@refs/tags/v{version}\n")
    payload, (signer,) = open_bundle(_bundle(version), policy, CAP)
    statement = json.loads(payload)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["subject"][0]["name"] == "checksums.txt"
    assert (signer.identity, signer.issuer, signer.log_index) == (
        f"{WORKFLOW}@refs/tags/v{version}",
        GITHUB,
        index,
    )
    assert signer.log_time is not None and signer.log_time.year == 2024


def test_an_anchored_regexp_trusts_every_release_tag() -> None:
    policy = _policy(
        f"name=releases sigstore issuer={GITHUB} "
        r"identity-regexp=https://github\.com/terraform-linters/tflint-ruleset-aws/"
        r"\.github/workflows/release\.yml@refs/tags/v[0-9.]+" + "\n"
    )
    for version in ("0.34.0", "0.35.0"):
        _, (signer,) = open_bundle(_bundle(version), policy, CAP)
        assert signer.name == "releases"


def test_a_real_certificates_source_extensions_are_read_and_pinned() -> None:
    """docs/keys.md's offline example: Fulcio's real extensions (DER UTF8String) decode to the
    repository, ref, calling workflow and event, and a pin on each is honoured."""
    identity = f"{WORKFLOW}@refs/tags/v0.34.0"
    repo = "https://github.com/terraform-linters/tflint-ruleset-aws"
    line = f"sigstore issuer={GITHUB} identity={identity} source-repository={repo} "
    _, (signer,) = open_bundle(_bundle("0.34.0"), _policy(line + "build-trigger=push\n"), CAP)
    assert dict(signer.source) == {
        "source-repository": repo,
        "source-ref": "refs/tags/v0.34.0",
        "build-config": identity,
        "build-trigger": "push",
    }
    with pytest.raises(Rejected) as caught:
        open_bundle(_bundle("0.34.0"), _policy(line + "build-trigger=pull_request_target\n"), CAP)
    assert caught.value.reason is Reason.WRONG_IDENTITY
    assert "build-trigger is push" in caught.value.detail


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (f"sigstore issuer={GITHUB} identity={WORKFLOW}@refs/tags/v0.35.0", Reason.WRONG_IDENTITY),
        (
            f"sigstore issuer=https://gitlab.com identity={WORKFLOW}@refs/tags/v0.34.0",
            Reason.WRONG_ISSUER,
        ),
        (
            f"sigstore issuer={GITHUB} identity-regexp=terraform-linters/tflint-ruleset-aws",
            Reason.UNANCHORED_IDENTITY,
        ),
        (f"sigstore issuer={GITHUB} identity={WORKFLOW}", Reason.WRONG_IDENTITY),
    ],
)
def test_a_real_bundle_is_refused_by_each_identity_rule(line: str, reason: Reason) -> None:
    with pytest.raises(Rejected) as caught:
        open_bundle(_bundle("0.34.0"), _policy(line + "\n"), CAP)
    assert caught.value.reason is reason, caught.value


def test_a_revoked_identity_voids_its_bundle() -> None:
    identity = f"{WORKFLOW}@refs/tags/v0.34.0"
    policy = _policy(
        f"sigstore issuer={GITHUB} identity={identity}\n"
        f"@revoked sigstore issuer={GITHUB} identity={identity}\n"
    )
    with pytest.raises(Rejected) as caught:
        open_bundle(_bundle("0.34.0"), policy, CAP)
    assert caught.value.reason is Reason.REVOKED


def test_the_staging_instance_is_a_foreign_root_to_public_good_and_verifies_under_its_own() -> None:
    data = (DATA / "staging-rekor-v2-conformance-beacon.sigstore.json").read_bytes()
    identity = (
        "https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/"
        ".github/workflows/extremely-dangerous-oidc-beacon.yml@refs/heads/main"
    )
    line = f"sigstore issuer={GITHUB} identity={identity}\n"
    with pytest.raises(Rejected) as caught:
        open_bundle(data, _policy(line), CAP)
    assert caught.value.reason is Reason.FOREIGN_TRUST_ROOT
    staging = (
        files("sigstore._store")
        .joinpath("https%3A%2F%2Ftuf-repo-cdn.sigstage.dev", "trusted_root.json")
        .read_bytes()
    )
    _, (signer,) = open_bundle(data, _policy(line, staging), CAP)
    assert signer.identity == identity and signer.log_time is not None  # the TSA's time


def test_a_public_good_bundle_whose_log_entry_lies_about_the_payload_is_refused() -> None:
    bundle = json.loads(_bundle("0.34.0"))
    other = json.loads(_bundle("0.35.0"))
    bundle["dsseEnvelope"] = other["dsseEnvelope"]  # a real envelope, signed by another cert
    policy = _policy(f"sigstore issuer={GITHUB} identity={WORKFLOW}@refs/tags/v0.34.0\n")
    with pytest.raises(Rejected) as caught:
        open_bundle(json.dumps(bundle).encode(), policy, CAP)
    assert caught.value.reason is Reason.BAD_SIGNATURE
