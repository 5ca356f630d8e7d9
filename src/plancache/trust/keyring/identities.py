"""Sigstore identities in a trusted-keys file: a CI job's OIDC identity trusted like a key.

A keyless signature (a Sigstore bundle, :mod:`plancache.trust.keyless.sigstore_bundle`) carries a
ten-minute certificate that Fulcio issued to an OIDC identity; the certificate's SAN and its
issuer extension say who signed. These lines say which identities are trusted::

    sigstore issuer=https://token.actions.githubusercontent.com identity=https://github.com/acme/serving/.github/workflows/bake.yml@refs/heads/main
    name=bake,valid-before=2027-01-01T00:00:00Z sigstore issuer=https://gitlab.com identity-regexp=https://gitlab\\.com/acme/serving//\\.gitlab-ci\\.yml@refs/tags/v.*
    @revoked sigstore issuer=https://gitlab.com identity=https://gitlab.com/acme/serving//.gitlab-ci.yml@refs/heads/old

The issuer is compared exactly; ``identity=`` is the SAN, exactly; ``identity-regexp=`` must
match the *whole* SAN (``re.fullmatch``): a pattern that would match only somewhere inside it
(``acme/serving`` inside ``evil/acme/serving-fork``) is the distinct rejection
``unanchored-identity``, so a forgotten anchor shows up in the first failed boot instead of
trusting a fork. Values hold no spaces (SANs and issuer URLs do not). The options before
``sigstore`` are the keys' (``name``, ``valid-after``, ``valid-before``), with the keys'
meaning but for one moment: the window must cover both the verifier's clock and the bundle's
*verified* signing time (:attr:`IdentitySigner.log_time`; the statement's ``signed_at`` must
agree with it: :func:`plancache.trust.keyring.signatories.current_signers`).
``@revoked`` voids everything an identity signed (for a regexp line, every SAN it matches).
Each trusted identity counts once toward the threshold, as a key does.
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

KEYWORD = "sigstore"
KEYID_PREFIX = "sigstore:"
"""How a keyless signer is named where a key id would be (``--json``'s ``keyid``)."""
MAX_IDENTITIES = 256
_FIELDS = ("issuer", "identity", "identity-regexp")


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

    def matches(self, san: str) -> bool:
        """The whole SAN is this identity (or full-matches its expression)."""
        if self.pattern is not None:
            return self.pattern.fullmatch(san) is not None
        return san == self.identity

    def matches_unanchored(self, san: str) -> bool:
        """It would match only if unanchored: found inside the SAN, not the SAN itself."""
        if self.pattern is not None:
            return self.pattern.search(san) is not None and not self.matches(san)
        return self.identity in san and san != self.identity

    def window_covers(self, moment: datetime) -> bool:
        """As :meth:`plancache.trust.keyring.keys.TrustedKey.window_covers`."""
        return (self.valid_after is None or moment >= self.valid_after) and (
            self.valid_before is None or moment < self.valid_before
        )

    @property
    def line(self) -> str:
        """The line's identity part, as an operator wrote it (for messages)."""
        kind = "identity-regexp" if self.regexp else "identity"
        return f"{KEYWORD} issuer={self.issuer} {kind}={self.identity}"


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

    def is_revoked(self, issuer: str, san: str) -> bool:
        return any(r.issuer == issuer and r.matches(san) for r in self.revoked)


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

    def window_covers(self, moment: datetime) -> bool:
        return self.line.window_covers(moment)


def is_identity_line(fields: list[str]) -> bool:
    """``sigstore …`` or ``options sigstore …``."""
    return bool(fields) and (
        fields[0] == KEYWORD or (len(fields) > 1 and "=" in fields[0] and fields[1] == KEYWORD)
    )


def parse_identity(
    fields: list[str], parse_options: Callable[[str], dict[str, str]]
) -> TrustedIdentity:
    """One identity line's fields (``is_identity_line``); ``parse_options`` is the keys' own.

    Raises:
        ConfigError: a field is missing, unknown, repeated or empty, or the expression does
            not compile, or the window holds no moment.
    """
    options = parse_options(fields[0]) if fields[0] != KEYWORD else {}
    values: dict[str, str] = {}
    for part in fields[2 if options else 1 :]:
        key, sep, value = part.partition("=")
        if not sep or key not in _FIELDS or key in values or not value:
            raise ConfigError(
                f"'{safe_text(part, 60)}' is not one of issuer=URL, identity=SAN, "
                "identity-regexp=EXPRESSION (each once, not empty, no spaces)"
            )
        values[key] = value
    if "issuer" not in values or ("identity" in values) == ("identity-regexp" in values):
        raise ConfigError(
            "a sigstore line takes issuer=URL and exactly one of identity=SAN, identity-regexp=…"
        )
    regexp = "identity-regexp" in values
    text = values["identity-regexp"] if regexp else values["identity"]
    pattern = None
    if regexp:
        try:
            pattern = re.compile(text)
        except re.error as exc:
            raise ConfigError(
                f"identity-regexp does not compile: {safe_text(str(exc), 80)}"
            ) from None
    after = parse_time(options["valid-after"], "valid-after") if "valid-after" in options else None
    before = (
        parse_time(options["valid-before"], "valid-before") if "valid-before" in options else None
    )
    if after is not None and before is not None and after >= before:
        raise ConfigError("valid-after is not before valid-before: the identity would never count")
    name = options.get("name") or text
    return TrustedIdentity(values["issuer"], text, regexp, name, after, before, pattern)


def add_identity(
    policy: IdentityPolicy | None, entry: TrustedIdentity, revoked: bool
) -> IdentityPolicy:
    """``policy`` with one more trusted (or revoked) line.

    Raises:
        ConfigError: the same line twice, or more than :data:`MAX_IDENTITIES` lines.
    """
    policy = policy or IdentityPolicy()
    held = policy.revoked if revoked else policy.trusted
    if any(
        (e.issuer, e.identity, e.regexp) == (entry.issuer, entry.identity, entry.regexp)
        for e in held
    ):
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
    return add_identity(policy, parse_identity(rest, parse_options), revoked), True
