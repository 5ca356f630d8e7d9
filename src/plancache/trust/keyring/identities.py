"""Sigstore identities in a trusted-keys file: a CI job's OIDC identity trusted like a key.

A keyless signature (a Sigstore bundle, :mod:`plancache.trust.keyless.sigstore_bundle`) carries a
ten-minute certificate that Fulcio issued to an OIDC identity; the certificate's SAN and its
issuer extension say who signed. These lines say which identities are trusted::

    sigstore issuer=https://token.actions.githubusercontent.com identity=https://github.com/acme/serving/.github/workflows/bake.yml@refs/heads/main
    name=bake,valid-before=2027-01-01T00:00:00Z sigstore issuer=https://gitlab.com identity-regexp=https://gitlab\\.com/acme/serving//\\.gitlab-ci\\.yml@refs/tags/v.*
    @revoked sigstore issuer=https://gitlab.com identity=https://gitlab.com/acme/serving//.gitlab-ci.yml@refs/heads/old

The issuer is a URL (``https://…``); ``identity=`` is the SAN, exactly; ``identity-regexp=`` must
match the *whole* SAN (``re.fullmatch``, ASCII classes: ``\\d`` is ``[0-9]``): a pattern that
matches only inside it, not from its start (``acme/serving`` inside
``https://github.com/evil/acme/serving-fork/…``), is the distinct rejection ``unanchored-identity``,
so a pattern written as a fragment shows up in the first failed boot instead of trusting a fork.
Issuers and SANs are compared after one normalisation, the same for trusting and revoking
(:mod:`.identity_match`: scheme and host in lower case, an issuer's trailing slash dropped).
``source-repository=``, ``source-ref=``, ``build-config=`` and ``build-trigger=`` (or their
``-regexp=`` forms) pin the build the certificate was issued to (Fulcio's extensions of those names;
for a GitHub reusable workflow the SAN is the *called* workflow, and only these say which
repository, ref and event called it). Values hold no spaces (SANs and issuer URLs do not); a value
in double quotes is read without them. The options before ``sigstore`` are the keys' (``name``,
``valid-after``, ``valid-before``), with the keys' meaning but for one moment: the window must cover
both the verifier's clock and the bundle's *verified* signing time (:attr:`IdentitySigner.log_time`;
the statement's ``signed_at`` must agree with it:
:func:`plancache.trust.keyring.signatories.current_signers`); when several lines match one
certificate, every one of them must admit it (:mod:`.identity_match`), whatever their order.
``@revoked`` voids everything an identity signed (for a regexp line, every SAN it matches); it takes
no window, and one spelled like a trusted line must be able to match it. Each trusted identity
counts once toward the threshold, as a key does.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .keys import Keyring

from ..display import safe_text
from ..errors import ConfigError
from ..statement import parse_time
from .identity_match import (
    PIN_FIELDS,
    REGEXP_SUFFIX,
    SOURCE_FIELDS,
    CertifiedIdentity,
    matching_san,
    near_miss,
    normal_issuer,
    normal_pin,
    normal_url,
)

KEYWORD = "sigstore"
KEYID_PREFIX = "sigstore:"
"""How a keyless signer is named where a key id would be (``--json``'s ``keyid``)."""
MAX_IDENTITIES = 256
_FIELDS = ("issuer", "identity", "identity-regexp", *PIN_FIELDS)


@dataclass(frozen=True)
class TrustedIdentity:
    """One ``sigstore issuer=… identity[-regexp]=…`` line: who may sign, and when."""

    issuer: str
    identity: str
    """The exact SAN, or the regular expression's text (``regexp``)."""
    regexp: bool = False
    name: str = ""
    valid_after: datetime | None = None
    valid_before: datetime | None = None
    pattern: re.Pattern[str] | None = field(default=None, compare=False, repr=False)
    source: tuple[tuple[str, str], ...] = ()
    """The source fields pinned (field, value), in :data:`~.identity_match.PIN_FIELDS` order
    (a ``-regexp`` field's value is its expression)."""

    def matches(self, cert: CertifiedIdentity) -> bool:
        """The certificate is this line's: issuer, a SAN and every pinned source field
        (:func:`~.identity_match.matching_san`)."""
        return matching_san(self, cert) is not None

    def window_covers(self, moment: datetime) -> bool:
        """As :meth:`plancache.trust.keyring.keys.TrustedKey.window_covers`."""
        return (self.valid_after is None or moment >= self.valid_after) and (
            self.valid_before is None or moment < self.valid_before
        )

    @property
    def line(self) -> str:
        """The line's identity part, as an operator wrote it (for messages)."""
        kind = "identity-regexp" if self.regexp else "identity"
        pins = "".join(f" {k}={v}" for k, v in self.source)
        return f"{KEYWORD} issuer={self.issuer} {kind}={self.identity}{pins}"

    @property
    def key(self) -> tuple[object, ...]:
        """What makes two lines the same line: their normal issuer, identity and pins."""
        identity = self.identity if self.regexp else normal_url(self.identity)
        pins = tuple((k, v if k.endswith(REGEXP_SUFFIX) else normal_pin(v)) for k, v in self.source)
        return (normal_issuer(self.issuer), identity, self.regexp, pins)


@runtime_checkable
class BundleSigner(Protocol):
    """A keyless signer (:mod:`plancache.keys.sigstore_signer`): it signs a statement's bytes
    into a Sigstore bundle, and knows the keyring that trusts exactly its identity."""

    def sign_statement(self, payload: bytes) -> bytes: ...

    def own_keyring(self) -> Keyring: ...


class _HasIdentities(Protocol):
    @property
    def identities(self) -> IdentityPolicy | None: ...


@dataclass(frozen=True)
class IdentityPolicy:
    """The trusted and revoked identities of a keyring, and the Sigstore trust root (the
    ``trusted_root.json`` bytes) their certificates and log entries must chain to; None until
    the keys layer pins one (``PLANCACHE_SIGSTORE_TRUSTED_ROOT``, else Sigstore's public-good
    root shipped with sigstore-python)."""

    trusted: tuple[TrustedIdentity, ...] = ()
    revoked: tuple[TrustedIdentity, ...] = ()
    trusted_root: bytes | None = None

    def merged(self, keyring: _HasIdentities) -> IdentityPolicy:
        other = keyring.identities
        if other is None:
            return self
        return IdentityPolicy(
            self.trusted + tuple(i for i in other.trusted if i not in self.trusted),
            self.revoked + tuple(i for i in other.revoked if i not in self.revoked),
            self.trusted_root or other.trusted_root,
        )

    def with_root(self, trusted_root: bytes) -> IdentityPolicy:
        return IdentityPolicy(self.trusted, self.revoked, trusted_root)

    def revoking(self, cert: CertifiedIdentity) -> TrustedIdentity | None:
        """The revocation line that matches the certificate, compared as trust is."""
        return next((r for r in self.revoked if r.matches(cert)), None)

    def check_revocations(self) -> None:
        """A revocation spelled like a trusted line but unable to match it (the identity in
        another case, another issuer, a pin trusted with another value) would revoke nothing,
        silently, while its author believes that identity revoked. A revocation of an identity
        no longer trusted at all is fine: it still voids what that identity signed (``prune
        --revoked``).

        Raises:
            ConfigError: a revocation line that is such a near miss of a trusted line.
        """
        for revoked in self.revoked:
            for trusted in self.trusted:
                if near_miss(revoked, trusted):
                    raise ConfigError(
                        f"'@revoked {safe_text(revoked.line, 160)}' is spelled like the trusted "
                        f"'{safe_text(trusted.line, 160)}' but can never match it, so it would "
                        "revoke nothing: write the issuer, identity and pins as the trusted "
                        "line does"
                    )


@dataclass(frozen=True)
class IdentitySigner:
    """Who signed a verified bundle: the trusted line it matched and what the bundle proved
    (the certificate's SAN and issuer, the transparency log's index and time)."""

    keyid: str
    name: str
    identity: str
    issuer: str
    log_index: int
    log_time: datetime | None
    """The verified signing time (Rekor v1's integrated time under its SET, else the RFC 3161
    timestamp the verifier verified): what the line's window and the statement's ``signed_at``
    are judged against. Never an unsigned field of the bundle."""
    line: TrustedIdentity
    also: tuple[TrustedIdentity, ...] = ()
    """The other lines that match the certificate: each must admit it too (its window)."""
    source: tuple[tuple[str, str], ...] = ()
    """The certificate's source extensions (:attr:`CertifiedIdentity.source`), for reports."""

    def window_covers(self, moment: datetime) -> bool:
        """Every matching line's window covers ``moment``: no line's expiry is bypassed by
        another that matches too, and the order of lines never matters."""
        return all(line.window_covers(moment) for line in (self.line, *self.also))


def is_identity_line(fields: list[str]) -> bool:
    """``sigstore …`` or ``options sigstore …``."""
    return bool(fields) and (
        fields[0] == KEYWORD or (len(fields) > 1 and "=" in fields[0] and fields[1] == KEYWORD)
    )


def _unquoted(part: str) -> tuple[str, str]:
    """``key=value`` or ``key="value"`` (as ``allowed_signers`` lines are written); a quote
    left anywhere else would become part of the value, which then never matches.

    Raises:
        ConfigError: not ``key=value``, an unknown key, or a stray quote.
    """
    key, sep, value = part.partition("=")
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    if not sep or key not in _FIELDS or not value or any(q in value for q in "\"'"):
        raise ConfigError(
            f"'{safe_text(part, 60)}' is not one of issuer=URL, identity=SAN, "
            f"identity-regexp=EXPRESSION, {'=, '.join(SOURCE_FIELDS)}= or their -regexp= forms "
            "(each once, not empty, "
            "no spaces, no quotes inside)"
        )
    return key, value


def parse_identity(
    fields: list[str], parse_options: Callable[[str], dict[str, str]], revoked: bool = False
) -> TrustedIdentity:
    """One identity line's fields (``is_identity_line``); ``parse_options`` is the keys' own.

    Raises:
        ConfigError: a field is missing, unknown, repeated, empty or stray-quoted, the issuer
            is not a URL, the expression does not compile, the window holds no moment, or a
            revocation has a window (``@revoked`` voids everything the identity signed).
    """
    options = parse_options(fields[0]) if fields[0] != KEYWORD else {}
    values: dict[str, str] = {}
    for part in fields[2 if options else 1 :]:
        key, value = _unquoted(part)
        if key in values:
            raise ConfigError(f"'{safe_text(key, 40)}=' is given twice")
        values[key] = value
    if "issuer" not in values or ("identity" in values) == ("identity-regexp" in values):
        raise ConfigError(
            "a sigstore line takes issuer=URL and exactly one of identity=SAN, identity-regexp=…"
        )
    check_issuer(values["issuer"])
    check_pins(values)
    regexp = "identity-regexp" in values
    text = values["identity-regexp"] if regexp else values["identity"]
    pattern = compile_expression("identity-regexp", text) if regexp else None
    if revoked and ("valid-after" in options or "valid-before" in options):
        raise ConfigError(
            "@revoked sigstore takes no valid-after/valid-before: a revocation voids everything "
            "the identity signed (to stop trusting it from a date, give its trusted line "
            "valid-before)"
        )
    after = parse_time(options["valid-after"], "valid-after") if "valid-after" in options else None
    before = (
        parse_time(options["valid-before"], "valid-before") if "valid-before" in options else None
    )
    if after is not None and before is not None and after >= before:
        raise ConfigError("valid-after is not before valid-before: the identity would never count")
    name = options.get("name") or text
    for key in SOURCE_FIELDS:
        if key in values and key + REGEXP_SUFFIX in values:
            raise ConfigError(f"{key}= and {key}{REGEXP_SUFFIX}= pin one field twice: use one")
        if key + REGEXP_SUFFIX in values:
            compile_expression(key + REGEXP_SUFFIX, values[key + REGEXP_SUFFIX])
    source = tuple((k, values[k]) for k in PIN_FIELDS if k in values)
    return TrustedIdentity(values["issuer"], text, regexp, name, after, before, pattern, source)


def add_identity(
    policy: IdentityPolicy | None, entry: TrustedIdentity, revoked: bool
) -> IdentityPolicy:
    """``policy`` with one more trusted (or revoked) line.

    Raises:
        ConfigError: the same line twice (after normalisation), or more than
            :data:`MAX_IDENTITIES` lines.
    """
    policy = policy or IdentityPolicy()
    held = policy.revoked if revoked else policy.trusted
    if any(e.key == entry.key for e in held):
        raise ConfigError(f"'{safe_text(entry.line, 120)}' is already listed")
    if len(policy.trusted) + len(policy.revoked) >= MAX_IDENTITIES:
        raise ConfigError(f"more than {MAX_IDENTITIES} sigstore lines")
    if revoked:
        return IdentityPolicy(policy.trusted, (*held, entry), policy.trusted_root)
    return IdentityPolicy((*held, entry), policy.revoked, policy.trusted_root)


def identity_entry(
    line: str, policy: IdentityPolicy | None, parse_options: Callable[[str], dict[str, str]]
) -> tuple[IdentityPolicy | None, bool]:
    """A trusted-keys file's line: ``(policy with it, True)`` when it is a sigstore line
    (``@revoked`` or not), else ``(policy, False)`` for the key parser.

    Raises:
        ConfigError: a sigstore line that does not parse (:func:`parse_identity`,
            :func:`add_identity`).
    """
    fields = line.split()
    revoked = bool(fields) and fields[0] == "@revoked"
    rest = fields[1:] if revoked else fields
    if not is_identity_line(rest):
        return policy, False
    return add_identity(policy, parse_identity(rest, parse_options, revoked), revoked), True


# What a ``sigstore`` line's values must look like to match anything Fulcio writes.
#
# A line whose issuer, pin or expression is spelled so that no certificate can ever match it is
# harmless as a trusted line (the first verification says ``wrong-identity``, naming the field)
# but silent as ``@revoked``: it revokes nothing while its author believes the identity revoked.
# So each such spelling is refused at load, with the spelling Fulcio writes (issue 48 items 5
# and 8): an issuer without its scheme, a repository without its scheme or with a trailing slash
# or ``.git``, a short ref, an expression spelling the (lower-cased) scheme or host with
# capitals. Pure: text in, nothing or a :class:`~..errors.ConfigError` out.


def check_issuer(issuer: str) -> None:
    """An OIDC issuer is an http(s) URL: Fulcio writes it so, and a bare host never matches.

    Raises:
        ConfigError: no scheme, or not http(s), with the likely fix.
    """
    scheme, sep, rest = issuer.partition("://")
    if not sep and ":/" not in issuer:
        raise ConfigError(
            f"issuer '{safe_text(issuer, 80)}' has no scheme: an OIDC issuer is a URL, "
            f"write issuer=https://{safe_text(issuer, 80)}"
        )
    if scheme.lower() not in ("https", "http") or not rest:
        raise ConfigError(f"issuer '{safe_text(issuer, 80)}' is not an https:// URL")


def check_pins(values: dict[str, str]) -> None:
    """Exact pins spelled as Fulcio never writes them (a repository without its scheme, with a
    trailing slash or ``.git``, a ref without ``refs/``) match no certificate: a trusted line
    fails visibly, but an ``@revoked`` one would revoke nothing, silently.

    Raises:
        ConfigError: such a pin, with the spelling Fulcio writes.
    """
    for key in ("source-repository", "build-config"):
        if key not in values:
            continue
        value = values[key]
        if "://" not in value:
            raise ConfigError(
                f"{key}={safe_text(value, 80)} has no scheme: Fulcio writes a URL, "
                f"{key}=https://{safe_text(value, 80)}"
            )
        if value.endswith("/") or (key == "source-repository" and value.endswith(".git")):
            raise ConfigError(
                f"{key}={safe_text(value, 80)}: Fulcio writes the URL without a trailing "
                "slash or .git, so it would never match"
            )
    ref = values.get("source-ref", "refs/")
    if not ref.startswith("refs/"):
        raise ConfigError(
            f"source-ref={safe_text(ref, 80)} is not a full ref: Fulcio writes "
            f"source-ref=refs/heads/{safe_text(ref, 80)} (or refs/tags/…)"
        )


def _capital_in_host(expression: str) -> bool:
    """Whether an expression spells its URL's scheme or host with a capital letter as a literal
    (outside a ``[...]`` class, not an escape such as ``\\D``): the text it is matched with has
    them in lower case (:func:`~.identity_match.normal_url`), so such a line could never match
    anything, and as ``@revoked`` would revoke nothing, silently."""
    scheme, sep, rest = expression.partition("://")
    if not sep or re.compile(expression, re.ASCII).flags & re.IGNORECASE:
        return False
    prefix, escaped, depth = scheme + sep + rest.partition("/")[0], False, 0
    for char in prefix:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "[":
            depth += 1
        elif char == "]" and depth:
            depth -= 1
        elif "A" <= char <= "Z" and not depth:
            return True
    return False


def _nested_repetition(expression: str) -> bool:
    """Whether a group holding an unbounded repetition (``*``, ``+``, ``{n,}``) is itself
    repeated: the classic exponential backtracking (``(/.*)*``, ``(a+)+``). Read from the text
    (escapes and ``[...]`` classes skipped), not from ``re``'s private parser. It does not catch
    every slow expression (``(a|aa)*`` overlaps without nesting); the length cap
    (:data:`~.identity_match.MAX_MATCHED_TEXT`) bounds the polynomial ones."""
    unbounded = [False]  # per open group: does it hold an unbounded repetition?
    escaped, in_class, closed = False, False, False
    for at, char in enumerate(expression):
        was_closed, closed = closed, False
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "(":
            unbounded.append(False)
        elif char == ")" and len(unbounded) > 1:
            inner = unbounded.pop()
            closed = inner
            unbounded[-1] = unbounded[-1] or inner
        elif char in "*+" or (char == "{" and re.match(r"\{\d*,\d*\}", expression[at:])):
            bound = re.match(r"\{\d*,(\d*)\}", expression[at:]) if char == "{" else None
            if was_closed and (bound is None or not bound.group(1) or int(bound.group(1)) > 1):
                return True
            if bound is None or not bound.group(1):
                unbounded[-1] = True
    return False


def compile_expression(key: str, expression: str) -> re.Pattern[str]:
    """An ``identity-regexp=`` or ``…-regexp=`` value, compiled with ASCII classes.

    Raises:
        ConfigError: it does not compile, or it spells a URL's host with capitals
            (:func:`_capital_in_host`).
    """
    try:
        pattern = re.compile(expression, re.ASCII)
    except re.error as exc:
        raise ConfigError(f"{key} does not compile: {safe_text(str(exc), 80)}") from None
    if _nested_repetition(expression):
        raise ConfigError(
            f"{key}={safe_text(expression, 80)} repeats a group that itself repeats without "
            "bound (like (/.*)*): matching it against a hostile SAN can take exponential time; "
            "write the group without the outer repetition"
        )
    if _capital_in_host(expression):
        raise ConfigError(
            f"{key}={safe_text(expression, 80)} spells the scheme or host with capitals, but "
            "they are matched in lower case (as URLs compare): write them in lower case"
        )
    return pattern
