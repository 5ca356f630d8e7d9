"""Identity lines as an attacker and a new user meet them (issue 48 items 3-6, 8), through the
local Fulcio/Rekor (tests/sigstore_stack.py): the stack certifies a GitHub-shaped token as
Fulcio's GitHub issuer does (the SAN is the *called* workflow; the caller's repository, ref,
workflow and event go into the extensions), or with an ``otherName`` SAN, and sigstore-python's
real signer and verifier do the rest.

- item 3: ``source-repository=``/``source-ref=``/``build-config=``/``build-trigger=`` refuse a
  reusable workflow called from ``evil/fork`` on ``pull_request_target`` (``wrong-identity``
  naming the field), and ``verify --json`` names the caller;
- item 4: ``unanchored-identity`` only for an expression that matches inside the SAN, not from
  its start;
- item 5: revocation compared as trust is; windows on it refused; a near-miss revocation
  refused at load; the verdict independent of line order; ``doctor`` counts revocations;
- item 6: an ``otherName`` SAN matches an exact line; ``\\d`` is ASCII;
- item 8: quoted values, an issuer without a scheme, a token for another audience.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography import x509

from cli_support import run
from conftest import FP, NOW, plan_bytes
from plancache.keys.keyfile import load_keyring
from plancache.keys.schemes import load_signer
from plancache.storage.local.localdir import LocalPlanDir
from plancache.trust import envelope as dsse
from plancache.trust.errors import ConfigError, Reason, Rejected
from plancache.trust.keyless.dsse_extension import as_extension
from plancache.trust.keyring.keys import Keyring
from plancache.trust.keyring.trusted_keys_file import parse_trusted_keys
from plancache.trust.plans.plan import plan_name
from plancache.trust.signing import sign_plan
from plancache.trust.verify import verify_plan
from sigstore_stack import SigstoreStack

CALLED = "acme/serving/.github/workflows/bake.yml@refs/heads/main"
SAN = "https://github.com/" + CALLED
NAME = plan_name(FP)
OTHERNAME = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.7")
PINNED = (
    "source-repository=https://github.com/acme/serving source-ref=refs/heads/main "
    "build-trigger=push"
)


def _github(stack: SigstoreStack, repository: str, event: str, ref: str = "refs/heads/main") -> str:
    """A GitHub Actions token of a run in ``repository`` calling the reusable workflow CALLED."""
    return stack.token(
        f"repo:{repository}:ref:{ref}",
        job_workflow_ref=CALLED,
        repository=repository,
        ref=ref,
        workflow_ref=f"{repository}/.github/workflows/ci.yml@{ref}",
        event_name=event,
    )


@pytest.fixture(scope="module")
def stack() -> Iterator[SigstoreStack]:
    with SigstoreStack(now=NOW) as s:  # signs at the moment its statements say
        yield s


@pytest.fixture(scope="module")
def env(stack: SigstoreStack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("sigstore")
    (folder / "trust_config.json").write_bytes(stack.trust_config_bytes())
    return {"PLANCACHE_SIGSTORE_TRUST_CONFIG": str(folder / "trust_config.json")}


def signed(env: dict[str, str], token: str) -> bytes:
    signer = load_signer("sigstore", {**env, "SIGSTORE_ID_TOKEN": token})
    return sign_plan(NAME, plan_bytes(), signer, NOW, expires_at=NOW + timedelta(days=30))


@pytest.fixture(scope="module")
def from_fork(stack: SigstoreStack, env: dict[str, str]) -> bytes:
    return signed(env, _github(stack, "evil/fork", "pull_request_target"))


@pytest.fixture(scope="module")
def from_acme(stack: SigstoreStack, env: dict[str, str]) -> bytes:
    return signed(env, _github(stack, "acme/serving", "push"))


def trusting(stack: SigstoreStack, text: str) -> Keyring:
    keyring = parse_trusted_keys(text, "trusted")
    assert keyring.identities is not None
    ids = keyring.identities.with_root(stack.trusted_root_bytes())
    return Keyring(keyring.keys, keyring.revoked, keyring.threshold, ids)


def verdict(stack: SigstoreStack, sidecar: bytes, text: str) -> Reason | None:
    try:
        verify_plan(NAME, plan_bytes(), sidecar, trusting(stack, text), NOW)
    except Rejected as exc:
        return exc.reason
    return None


# -- item 3: the source ---------------------------------------------------------------------


def test_a_reusable_workflow_called_from_a_fork_is_refused_by_its_pins(
    stack: SigstoreStack, from_fork: bytes, from_acme: bytes
) -> None:
    bare = f"sigstore issuer={stack.issuer} identity={SAN}"
    assert verdict(stack, from_fork, bare + "\n") is None  # the SAN alone cannot tell them apart
    verified = verify_plan(
        NAME, plan_bytes(), from_acme, trusting(stack, f"{bare} {PINNED}\n"), NOW
    )
    (who,) = verified.identities
    assert dict(who.source)["source-repository"] == "https://github.com/acme/serving"
    for pin, field in [
        ("source-repository=https://github.com/acme/serving", "source-repository"),
        ("build-trigger=push", "build-trigger"),
        (
            "build-config=https://github.com/acme/serving/.github/workflows/ci.yml@refs/heads/main",
            "build-config",
        ),
    ]:
        with pytest.raises(Rejected) as caught:
            verify_plan(NAME, plan_bytes(), from_fork, trusting(stack, f"{bare} {pin}\n"), NOW)
        assert caught.value.reason is Reason.WRONG_IDENTITY, caught.value
        assert f"certificate's {field} is" in caught.value.detail, caught.value.detail


def test_a_regexp_pin_admits_every_release_tag_of_the_caller(
    stack: SigstoreStack, env: dict[str, str]
) -> None:
    tagged = signed(env, _github(stack, "acme/serving", "push", ref="refs/tags/v1.4.0"))
    bare = f"sigstore issuer={stack.issuer} identity={SAN}"
    tags = r"source-ref-regexp=refs/tags/v\d+\.\d+\.\d+"
    assert verdict(stack, tagged, f"{bare} {tags}\n") is None
    with pytest.raises(Rejected) as caught:
        verify_plan(NAME, plan_bytes(), tagged, trusting(stack, f"{bare} {tags}-rc\n"), NOW)
    assert caught.value.reason is Reason.WRONG_IDENTITY
    assert "source-ref is refs/tags/v1.4.0" in caught.value.detail
    for bad in (f"{bare} source-ref=refs/tags/v1 {tags}", f"{bare} source-ref-regexp=("):
        with pytest.raises(ConfigError):
            parse_trusted_keys(bad + "\n", "trusted")


def test_a_pin_refuses_a_certificate_that_states_no_source(
    stack: SigstoreStack, env: dict[str, str]
) -> None:
    sidecar = signed(env, stack.token(SAN))  # not GitHub-shaped: no source extensions
    line = f"sigstore issuer={stack.issuer} identity={SAN} source-ref=refs/heads/main\n"
    with pytest.raises(Rejected) as caught:
        verify_plan(NAME, plan_bytes(), sidecar, trusting(stack, line), NOW)
    assert caught.value.reason is Reason.WRONG_IDENTITY
    assert "source-ref is <not stated>" in caught.value.detail


def test_verify_json_names_the_caller_of_a_reusable_workflow(
    capsys: pytest.CaptureFixture[str],
    stack: SigstoreStack,
    from_fork: bytes,
    tmp_path: Path,
    plan_dir: Path,
) -> None:
    LocalPlanDir(plan_dir).write(FP, plan_bytes(), from_fork)
    (tmp_path / "root.json").write_bytes(stack.trusted_root_bytes())
    (tmp_path / "trusted").write_text(f"sigstore issuer={stack.issuer} identity={SAN}\n")
    code, out, err = run(
        capsys,
        "verify",
        "--trusted-keys",
        str(tmp_path / "trusted"),
        "--trusted-root",
        str(tmp_path / "root.json"),
        "--json",
        str(plan_dir),
    )
    assert code == 0, out + err
    (fact,) = json.loads(out)["plans"][0]["keyless"]
    assert fact["identity"] == SAN
    assert fact["source_repository"] == "https://github.com/evil/fork"
    assert fact["source_ref"] == "refs/heads/main"
    assert fact["build_trigger"] == "pull_request_target"
    assert fact["build_config"] == (
        "https://github.com/evil/fork/.github/workflows/ci.yml@refs/heads/main"
    )


# -- item 4: unanchored only when an anchor is missing -------------------------------------


@pytest.mark.parametrize(
    ("signed_as", "line", "reason"),
    [
        ("heads/main-old", "identity={san_main}", Reason.WRONG_IDENTITY),
        ("tags/v1.2-rc1", r"identity-regexp=^{esc}/tags/v\d+\.\d+$", Reason.WRONG_IDENTITY),
        ("tags/v1.2-rc1", r"identity-regexp={esc}/tags/v\d+\.\d+", Reason.WRONG_IDENTITY),
        ("heads/main", r"identity-regexp=acme/serving/\.github/.*", Reason.UNANCHORED_IDENTITY),
    ],
)
def test_unanchored_identity_only_when_an_anchor_is_missing(
    stack: SigstoreStack, env: dict[str, str], signed_as: str, line: str, reason: Reason
) -> None:
    sidecar = signed(env, stack.token(SAN.replace("refs/heads/main", "refs/" + signed_as)))
    esc = r"https://github\.com/acme/serving/\.github/workflows/bake\.yml@refs"
    text = f"sigstore issuer={stack.issuer} " + line.format(san_main=SAN, esc=esc) + "\n"
    assert verdict(stack, sidecar, text) is reason


# -- item 5: revocation and order -----------------------------------------------------------


def test_a_revocation_is_compared_as_trust_is(stack: SigstoreStack, from_acme: bytes) -> None:
    trusted = f"sigstore issuer={stack.issuer} identity={SAN}\n"
    shouted = SAN.replace("https://github.com", "HTTPS://GitHub.COM")
    revoked = f"@revoked sigstore issuer={stack.issuer}/ identity={shouted}\n"
    assert verdict(stack, from_acme, trusted + revoked) is Reason.REVOKED
    pinned = f"@revoked sigstore issuer={stack.issuer} identity={SAN} build-trigger=push\n"
    assert verdict(stack, from_acme, trusted + pinned) is Reason.REVOKED
    other = f"@revoked sigstore issuer={stack.issuer} identity={SAN} build-trigger=schedule\n"
    assert verdict(stack, from_acme, trusted + other) is None


@pytest.mark.parametrize(
    ("revocation", "says"),
    [
        ("sigstore issuer={issuer} identity={path_case}", "can never match it"),
        ("sigstore issuer=https://gitlab.com identity={san}", "can never match it"),
        ("valid-after=2026-01-01T00:00:00Z sigstore issuer={issuer} identity={san}", "no valid-"),
    ],
)
def test_a_revocation_that_would_revoke_nothing_is_refused_at_load(
    stack: SigstoreStack, revocation: str, says: str
) -> None:
    text = f"sigstore issuer={stack.issuer} identity={SAN}\n@revoked " + revocation.format(
        issuer=stack.issuer, san=SAN, path_case=SAN.replace("acme/serving", "Acme/Serving")
    )
    with pytest.raises(ConfigError) as caught:
        parse_trusted_keys(text + "\n", "trusted")
    assert says in caught.value.detail and "trusted:" in caught.value.detail


def test_revoking_an_identity_no_longer_trusted_still_loads(stack: SigstoreStack) -> None:
    text = (
        f"sigstore issuer={stack.issuer} identity={SAN}\n"
        f"@revoked sigstore issuer={stack.issuer} identity={SAN.replace('main', 'old')}\n"
    )
    ids = parse_trusted_keys(text, "trusted").identities
    assert ids is not None and len(ids.revoked) == 1


@pytest.mark.parametrize("order", [1, -1])
def test_the_verdict_does_not_depend_on_line_order(
    stack: SigstoreStack, from_acme: bytes, order: int
) -> None:
    lines = [
        f"valid-before=2026-01-01T00:00:00Z sigstore issuer={stack.issuer} identity={SAN}",
        f"sigstore issuer={stack.issuer} identity-regexp=https://github\\.com/acme/.*",
    ]
    assert verdict(stack, from_acme, "\n".join(lines[::order]) + "\n") is Reason.EXPIRED


def test_doctor_counts_revoked_identities(
    capsys: pytest.CaptureFixture[str],
    stack: SigstoreStack,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trusted = tmp_path / "trusted"
    trusted.write_text(
        f"sigstore issuer={stack.issuer} identity={SAN}\n"
        f"@revoked sigstore issuer={stack.issuer} identity={SAN.replace('main', 'old')}\n"
    )
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(trusted))
    _, out, _ = run(capsys, "doctor", "--json")
    check = {c["name"]: c for c in json.loads(out)["checks"]}["trusted-keys"]
    assert "1 revoked identity" in check["detail"], check
    assert check["data"]["revoked_identities"] == [
        f"sigstore issuer={stack.issuer} identity={SAN.replace('main', 'old')}"
    ]


# -- item 6: SANs as text, ASCII classes ----------------------------------------------------


def test_an_othername_san_matches_an_exact_line_and_digits_are_ascii(
    stack: SigstoreStack, env: dict[str, str]
) -> None:
    stack.othername_sans = True
    try:
        plain = signed(env, stack.token("ci!acme.example"))
        arabic = signed(env, stack.token("ci-\u0661!acme.example"))  # ARABIC-INDIC DIGIT ONE
    finally:
        stack.othername_sans = False
    exact = f"sigstore issuer={stack.issuer} identity=ci!acme.example\n"
    verified = verify_plan(NAME, plan_bytes(), plain, trusting(stack, exact), NOW)
    assert verified.identities[0].identity == "ci!acme.example"
    digits = f"sigstore issuer={stack.issuer} identity-regexp=ci-\\d!acme\\.example\n"
    assert verdict(stack, arabic, digits) is Reason.WRONG_IDENTITY


# -- item 8: lines and tokens a new user writes --------------------------------------------


def test_a_quoted_line_is_read_without_its_quotes(stack: SigstoreStack, from_acme: bytes) -> None:
    quoted = f'name="bake" sigstore issuer="{stack.issuer}" identity="{SAN}"\n'
    assert verdict(stack, from_acme, quoted) is None
    for bad in (
        f'issuer="{stack.issuer} identity={SAN}',
        f"issuer={stack.issuer} identity='{SAN}\"",
    ):
        with pytest.raises(ConfigError) as caught:
            parse_trusted_keys(f"sigstore {bad}\n", "trusted")
        assert "quotes" in caught.value.detail


def test_an_issuer_without_a_scheme_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_trusted_keys(
            f"sigstore issuer=token.actions.githubusercontent.com identity={SAN}\n", "trusted"
        )
    assert "write issuer=https://token.actions.githubusercontent.com" in caught.value.detail


def test_a_token_for_another_audience_says_it_must_be_sigstore(
    stack: SigstoreStack, env: dict[str, str]
) -> None:
    token = stack.token(SAN, audience="api://AzureADTokenExchange")
    with pytest.raises(ConfigError) as caught:
        load_signer("sigstore", {**env, "SIGSTORE_ID_TOKEN": token})
    assert "audience is 'sigstore'" in caught.value.detail
    assert "AzureADTokenExchange" in caught.value.detail and token not in caught.value.detail


def test_an_identity_regexp_classes_are_ascii() -> None:
    text = "sigstore issuer=https://gitlab.com identity-regexp=https://x/v\\d+\\w\\s?\n"
    ids = parse_trusted_keys(text, "trusted").identities
    assert ids is not None and ids.trusted[0].pattern is not None
    pattern = ids.trusted[0].pattern
    assert pattern.fullmatch("https://x/v12a") is not None
    for lookalike in ("https://x/v\u0661a", "https://x/v1\u00e9", "https://x/v1a\u2003"):
        assert pattern.fullmatch(lookalike) is None, lookalike


def test_a_revocation_pinned_apart_from_its_trusted_line_is_refused(stack: SigstoreStack) -> None:
    trusted = f"sigstore issuer={stack.issuer} identity={SAN} source-ref-regexp=refs/tags/v.*\n"
    one_tag = f"@revoked sigstore issuer={stack.issuer} identity={SAN} source-ref=refs/tags/v1\n"
    ids = parse_trusted_keys(trusted + one_tag, "trusted").identities
    assert ids is not None and len(ids.revoked) == 1
    branch = one_tag.replace("refs/tags/v1", "refs/heads/main")
    with pytest.raises(ConfigError) as caught:
        parse_trusted_keys(trusted + branch, "trusted")
    assert "can never match it" in caught.value.detail


# -- red team (redteam48b): spellings that made two identities one, one signer counted twice ----


def test_a_ref_with_an_at_sign_is_not_folded_as_an_e_mail_domain(
    stack: SigstoreStack, env: dict[str, str]
) -> None:
    """``refs/heads/rel@PROD`` is another branch than ``refs/heads/rel@prod``: a pin was once
    compared after the e-mail fold (the text after ``@`` in lower case), so anyone who could
    push a branch of that name signed as the pinned ref."""
    line = f"sigstore issuer={stack.issuer} identity={SAN} source-ref=refs/heads/rel@prod\n"
    other = signed(env, _github(stack, "acme/serving", "push", ref="refs/heads/rel@PROD"))
    assert verdict(stack, other, line) is Reason.WRONG_IDENTITY
    pinned = signed(env, _github(stack, "acme/serving", "push", ref="refs/heads/rel@prod"))
    assert verdict(stack, pinned, line) is None


def test_a_non_ascii_host_is_not_folded_into_an_ascii_one(
    stack: SigstoreStack, env: dict[str, str]
) -> None:
    """``str.lower`` folds KELVIN SIGN (U+212A) into ``k``: an otherName SAN naming the host
    ``\\u212aube.example`` matched a line trusting ``kube.example``."""
    text = "https://\u212aube.example/x".encode()
    stack.san_override = [x509.OtherName(OTHERNAME, b"\x0c" + bytes([len(text)]) + text)]
    try:
        sidecar = signed(env, stack.token("whoever"))
    finally:
        stack.san_override = None
    line = f"sigstore issuer={stack.issuer} identity=https://kube.example/x\n"
    assert verdict(stack, sidecar, line) is Reason.WRONG_IDENTITY


def test_an_issuer_extension_that_is_not_text_is_no_issuer(
    stack: SigstoreStack, env: dict[str, str]
) -> None:
    """A ``.1.8`` issuer that is not a UTF8String is left out, not replaced by the ``.1.1``
    beside it (the old reader refused the bundle; the new one once fell back)."""
    ia5 = b"\x16" + bytes([len(stack.issuer)]) + stack.issuer.encode()
    stack.replaced_extensions = {"1.3.6.1.4.1.57264.1.8": ia5}
    try:
        sidecar = signed(env, _github(stack, "acme/serving", "push"))
    finally:
        stack.replaced_extensions = {}
    assert verdict(stack, sidecar, f"sigstore issuer={stack.issuer} identity={SAN}\n") in (
        Reason.WRONG_ISSUER,
        Reason.WRONG_IDENTITY,
    )


@pytest.mark.parametrize(
    "line",
    [
        r"sigstore issuer=https://gh.example identity-regexp=https://GitHub\.com/acme/.*",
        r"@revoked sigstore issuer=https://gh.example identity-regexp=https://GitHub\.com/acme/.*",
        r"sigstore issuer=https://gh.example identity=https://github.com/a "
        r"source-repository-regexp=HTTPS://github\.com/acme/.*",
    ],
)
def test_an_expression_with_a_capital_host_is_refused_at_load(line: str) -> None:
    """The SAN (and a URL pin) is matched with its scheme and host in lower case, so an
    expression that spells them with capitals matches nothing: as ``@revoked`` it revoked
    nothing, silently."""
    with pytest.raises(ConfigError, match="lower case"):
        parse_trusted_keys(line + "\n", "trusted")


def test_an_expression_may_use_capitals_in_a_class_an_escape_or_under_i() -> None:
    for rx in (r"https://[A-Za-z]+\.example/.*", r"(?i)https://GitHub\.com/.*", r"https://\S+"):
        parse_trusted_keys(f"sigstore issuer=https://gh.example identity-regexp={rx}\n", "t")


def test_one_workflow_matching_two_lines_is_one_signer(
    stack: SigstoreStack, env: dict[str, str]
) -> None:
    """Two lines for one SAN (pinned to two triggers) and two runs of that workflow: one signer,
    not a threshold of two met by one CI identity."""
    pushed = signed(env, _github(stack, "acme/serving", "push"))
    dispatched = signed(env, _github(stack, "acme/serving", "workflow_dispatch"))
    first, second = as_extension(pushed), as_extension(dispatched)
    assert first.payload == second.payload
    both = dsse.encode(
        dsse.Envelope(first.payload_type, first.payload, (*first.signatures, *second.signatures))
    )
    lines = (
        f"sigstore issuer={stack.issuer} identity={SAN} build-trigger=push\n"
        f"sigstore issuer={stack.issuer} identity={SAN} build-trigger=workflow_dispatch\n"
    )
    keyring = trusting(stack, lines)
    with pytest.raises(Rejected) as caught:
        verify_plan(NAME, plan_bytes(), both, keyring.with_threshold(2), NOW)
    assert caught.value.reason is Reason.THRESHOLD
    assert verify_plan(NAME, plan_bytes(), both, keyring, NOW).signers == (SAN,)


@pytest.mark.parametrize(
    ("pin", "fix"),
    [
        ("source-repository=github.com/evil/serving", "source-repository=https://github.com"),
        ("source-repository=https://github.com/evil/serving/", "trailing slash"),
        ("source-repository=https://github.com/evil/serving.git", ".git"),
        ("build-config=github.com/evil/serving/.github/workflows/ci.yml@refs/heads/x", "https://"),
        ("source-ref=dev", "source-ref=refs/heads/dev"),
    ],
)
def test_a_pin_fulcio_never_writes_is_refused_so_a_revocation_is_never_a_no_op(
    stack: SigstoreStack, env: dict[str, str], pin: str, fix: str
) -> None:
    """Spelled so, ``@revoked sigstore … source-repository=github.com/evil/serving`` revoked
    nothing, silently: the fork's bundle stayed valid. Refused at load, with Fulcio's spelling;
    the same pin spelled as Fulcio writes it revokes."""
    trusted = f"sigstore issuer={stack.issuer} identity={SAN}\n"
    with pytest.raises(ConfigError, match=re.escape(fix)):
        parse_trusted_keys(f"{trusted}@revoked {trusted.strip()} {pin}\n", "trusted")
    fork = signed(env, _github(stack, "evil/serving", "push", ref="refs/heads/dev"))
    spelled = "source-repository=https://github.com/evil/serving"
    assert verdict(stack, fork, f"{trusted}@revoked {trusted.strip()} {spelled}\n") is (
        Reason.REVOKED
    )


def test_an_issuer_with_a_broken_scheme_gets_no_wrong_fix() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_trusted_keys("sigstore issuer=https:/gitlab.com identity=x@example.com\n", "t")
    assert "https://https:" not in caught.value.detail


def test_an_expression_is_never_matched_with_a_san_past_the_cap(
    stack: SigstoreStack, env: dict[str, str]
) -> None:
    """Python's ``re`` has no timeout: the ``unanchored-identity`` search of
    ``.*acme/serving.*@refs/tags/v.*`` over an 8,000-character SAN (a signer's own branch name)
    took 9 s per bundle. A SAN past MAX_MATCHED_TEXT matches no expression; an exact line still
    compares (the length alone is no verdict)."""
    from plancache.trust.keyring.identity_match import MAX_MATCHED_TEXT

    long_san = SAN + "/" + "acme/serving/" * 80
    assert len(long_san) > MAX_MATCHED_TEXT
    stack.san_override = [x509.UniformResourceIdentifier(long_san)]
    try:
        sidecar = signed(env, stack.token("whoever"))
    finally:
        stack.san_override = None
    everything = rf"sigstore issuer={stack.issuer} identity-regexp=https://github\.com/acme/.*"
    assert verdict(stack, sidecar, everything + "\n") is Reason.WRONG_IDENTITY
    assert verdict(stack, sidecar, f"sigstore issuer={stack.issuer} identity={long_san}\n") is None


@pytest.mark.parametrize(
    "expression",
    [
        r"https://github\.com/(acme|[a-z-]+)/.*(/.*)*@refs/heads/main",
        r"https://x/(a+)+",
        r"(b.*){2,}",
    ],
)
def test_an_expression_repeating_an_unbounded_group_is_refused(expression: str) -> None:
    """Exponential backtracking: the first one took over 30 s against a 200-character SAN."""
    with pytest.raises(ConfigError, match="exponential"):
        parse_trusted_keys(
            f"sigstore issuer=https://gh.example identity-regexp={expression}\n", "t"
        )
    pin = f"sigstore issuer=https://gh.example identity=x source-ref-regexp={expression}\n"
    with pytest.raises(ConfigError, match="exponential"):
        parse_trusted_keys(pin, "t")


def test_a_near_miss_revocation_in_another_file_of_a_directory_is_refused(tmp_path: Path) -> None:
    """Each file of a trusted-keys directory was checked alone: a ``revoked.pub`` spelling the
    trusted identity with the org in capitals loaded beside ``trusted.pub`` and revoked nothing
    (the bundle stayed valid). Checked across the files, as within one."""
    issuer = "https://token.actions.githubusercontent.com"
    (tmp_path / "trusted.pub").write_text(f"sigstore issuer={issuer} identity={SAN}\n")
    near = SAN.replace("acme", "ACME")
    (tmp_path / "revoked.pub").write_text(f"@revoked sigstore issuer={issuer} identity={near}\n")
    with pytest.raises(ConfigError, match="can never match it"):
        load_keyring(tmp_path, pin_root=False)
    (tmp_path / "revoked.pub").write_text(f"@revoked sigstore issuer={issuer} identity={SAN}\n")
    assert load_keyring(tmp_path, pin_root=False).identities is not None


def test_only_the_scheme_and_host_are_folded() -> None:
    """A URL's user name is case-sensitive (RFC 3986 6.2.2.1): ``https://Ops@git.example/x`` and
    ``https://ops@git.example/x`` are two identities; the host's case is not."""
    from plancache.trust.keyring.identity_match import normal_url

    assert normal_url("HTTPS://Ops@GIT.Example:8443/A") == "https://Ops@git.example:8443/A"
    assert normal_url("https://Ops@git.example/x") != normal_url("https://ops@git.example/x")
