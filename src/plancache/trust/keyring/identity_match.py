"""Which ``sigstore`` lines a certificate's identity matches, and why none does.

The one comparison that trusting and revoking share (issue 48 items 4 and 5), so that a
revocation line revokes exactly what the same line would have trusted: the issuer and the SANs
are compared after :func:`normal_url` (scheme and host in lower case, the path's trailing
slashes dropped from an issuer) on both sides; an exact ``identity=`` then equals the SAN, an
``identity-regexp=`` full-matches it (ASCII classes: ``\\d`` is ``[0-9]``), and every source field
the line pins (``source-repository=``, ...) equals the certificate's extension of that name.

Several lines may match one certificate (an exact line and a regexp covering it). The verdict
never depends on their order in the file: **every** matching line must admit the signer (its
window, :meth:`~.identities.IdentitySigner.window_covers`), so a line's expiry is never
bypassed by another line that also matches; the most specific of them (exact before regexp,
more source fields pinned first, then the line's text) names the signer and counts toward the
threshold. Pure: text in, lines or a :class:`~..errors.Rejected` out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..display import safe_text
from ..errors import Reason, Rejected

if TYPE_CHECKING:
    from .identities import TrustedIdentity

SOURCE_FIELDS = ("source-repository", "source-ref", "build-config", "build-trigger")
"""The line fields that pin a certificate's source, each named after the Fulcio extension it is
compared with (source repository URI, source repository ref, build config URI, build trigger).
Each also has a ``-regexp`` form (``source-ref-regexp=refs/tags/v[0-9.]+``), full-matched as
``identity-regexp=`` is: a release calling a reusable workflow from any of its tags."""
REGEXP_SUFFIX = "-regexp"
PIN_FIELDS = tuple(f + suffix for f in SOURCE_FIELDS for suffix in ("", REGEXP_SUFFIX))
"""What a line may pin: each source field, exact or as a regular expression."""


MAX_MATCHED_TEXT = 1024
"""The longest SAN or source value an expression is matched with. Python's ``re`` has no
timeout, and an expression's search (the ``unanchored-identity`` diagnosis) over text the
signer chose (their own repository and branch name, under the same issuer) takes time
polynomial in its length (``.*acme/serving.*@refs/tags/v.*``: 9 s at 8,000 characters); a
Fulcio SAN or ref is far shorter. Longer text matches no expression (exact lines still
compare)."""


def _within_cap(text: str) -> bool:
    return len(text) <= MAX_MATCHED_TEXT


def _pin_matches(field: str, value: str, stated: str) -> bool:
    """A pin (``field`` exact, or ``field-regexp``) against the certificate's stated value,
    compared as :func:`normal_pin` writes both (an expression sees the stated value so)."""
    if field.endswith(REGEXP_SUFFIX):  # compiled (and cached) at load
        text = normal_pin(stated)
        return _within_cap(text) and re.fullmatch(value, text, re.ASCII) is not None
    return normal_pin(stated) == normal_pin(value)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _lower(text: str) -> str:
    """ASCII letters in lower case, nothing else: ``str.lower`` would also fold non-ASCII
    letters, some into ASCII (KELVIN SIGN U+212A into ``k``), and so make a host that is not
    ``kube.example`` equal to it."""
    return text.translate(_ASCII_LOWER)


def normal_url(text: str, *, trailing_slash: bool = False) -> str:
    """``text`` with its scheme and host in lower case (they are case-insensitive, RFC 3986
    6.2.2.1; ASCII letters only), and for an issuer (``trailing_slash``) without trailing
    slashes on its path (``https://gitlab.com/`` is the issuer ``https://gitlab.com``). The rest
    is kept byte for byte (no URL parser's round trip, which would drop an empty ``?`` or ``#``
    and so make two SANs one). An e-mail address keeps its local part and lowers its domain;
    anything else is returned as it is."""
    if "://" not in text:
        local, at, domain = text.rpartition("@")
        return f"{local}@{_lower(domain)}" if at and local else text
    return normal_pin(text, trailing_slash=trailing_slash)


def normal_pin(text: str, *, trailing_slash: bool = False) -> str:
    """A source field's value: a URL (``source-repository``, ``build-config``) as
    :func:`normal_url` writes it, anything else (a ref, a trigger) byte for byte. A ref is not
    an e-mail address: ``refs/heads/rel@PROD`` is another branch than ``refs/heads/rel@prod``."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text
    authority, slash, path = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")  # a user name keeps its case
    path = slash + path
    if trailing_slash:
        path = path.rstrip("/")
    return f"{_lower(scheme)}://{userinfo}{at}{_lower(host)}{path}"


def normal_issuer(issuer: str) -> str:
    return normal_url(issuer, trailing_slash=True)


@dataclass(frozen=True)
class CertifiedIdentity:
    """What a verified Fulcio certificate says of its signer: the OIDC issuer, every SAN as
    text, and the source extensions it states (field name, value), in :data:`SOURCE_FIELDS`
    order."""

    issuer: str
    sans: tuple[str, ...]
    source: tuple[tuple[str, str], ...] = ()

    def stated(self, field: str) -> str | None:
        return dict(self.source).get(field)


def _who(cert: CertifiedIdentity) -> str:
    san = cert.sans[0] if cert.sans else "<no SAN>"
    return f"{safe_text(san, 120)} from {safe_text(cert.issuer or '<no issuer>', 80)}"


def specificity(line: TrustedIdentity) -> tuple[int, int, str]:
    """Sort key, most specific first: exact before regexp, more source fields first, then text."""
    return (1 if line.regexp else 0, -len(line.source), line.identity)


def _matches_san(line: TrustedIdentity, san: str) -> bool:
    pattern = line.pattern
    if pattern is not None:
        text = normal_url(san)
        return _within_cap(text) and pattern.fullmatch(text) is not None
    return normal_url(line.identity) == normal_url(san)


def source_mismatch(line: TrustedIdentity, cert: CertifiedIdentity) -> str | None:
    """The first field the line pins (``source-ref`` or ``source-ref-regexp``, ...) that the
    certificate does not state as pinned."""
    for field, value in line.source:
        stated = cert.stated(field.removesuffix(REGEXP_SUFFIX))
        if stated is None or not _pin_matches(field, value, stated):
            return field
    return None


def matching_san(line: TrustedIdentity, cert: CertifiedIdentity) -> str | None:
    """The certificate's SAN the line matches in full (issuer, SAN and source), else None."""
    if normal_issuer(line.issuer) != normal_issuer(cert.issuer):
        return None
    if source_mismatch(line, cert) is not None:
        return None
    return next((san for san in cert.sans if _matches_san(line, san)), None)


def trusted_lines(
    lines: tuple[TrustedIdentity, ...], cert: CertifiedIdentity
) -> list[tuple[TrustedIdentity, str]]:
    """Every line that matches the certificate in full, with the SAN it matched, most
    specific first (:func:`specificity`).

    Raises:
        Rejected: none matches, with the nearest miss: ``wrong-identity`` naming the source
            field that differs (the issuer and SAN matched), ``wrong-issuer`` (the SAN matched
            a line of another issuer), ``unanchored-identity`` (a regexp matches inside a SAN
            but not from its first character: a fragment, written as cosign's unanchored
            ``--certificate-identity-regexp`` takes it), else ``wrong-identity``.
    """
    found = [(line, san) for line in lines if (san := matching_san(line, cert)) is not None]
    if found:
        return sorted(found, key=lambda pair: specificity(pair[0]))
    who = _who(cert)
    issuer = normal_issuer(cert.issuer)
    same_issuer = [line for line in lines if normal_issuer(line.issuer) == issuer]
    for line in sorted(same_issuer, key=specificity):
        if any(_matches_san(line, san) for san in cert.sans):
            field = source_mismatch(line, cert) or ""
            stated = cert.stated(field.removesuffix(REGEXP_SUFFIX)) or "<not stated>"
            raise Rejected(
                Reason.WRONG_IDENTITY,
                f"the certificate's {field.removesuffix(REGEXP_SUFFIX)} is "
                f"{safe_text(stated, 120)}, the trusted line pins {field}="
                f"{safe_text(dict(line.source).get(field), 120)} (signed by {who})",
            )
    if any(_matches_san(line, san) for line in lines for san in cert.sans):
        raise Rejected(Reason.WRONG_ISSUER, f"the identity is trusted from another issuer ({who})")
    if any(_unanchored(line, san) for line in same_issuer for san in cert.sans):
        raise Rejected(
            Reason.UNANCHORED_IDENTITY,
            "a trusted identity-regexp matches only inside the certificate's SAN, not from its "
            f"start: it must match the whole SAN ({who})",
        )
    raise Rejected(Reason.WRONG_IDENTITY, f"no trusted identity signed it (signed by {who})")


def _unanchored(line: TrustedIdentity, san: str) -> bool:
    """A regexp that finds itself inside the SAN but cannot match from its first character: it
    lacks the leading part (an anchor) a full match needs. An exact line, or a regexp that
    matches a prefix and then stops (``…v\\d+\\.\\d+`` against ``v1.2-rc1``), is a different
    identity (``wrong-identity``): loosening it would be the mistake."""
    pattern = line.pattern
    if pattern is None:
        return False
    text = normal_url(san)
    if not _within_cap(text):
        return False
    return pattern.search(text) is not None and pattern.match(text) is None


def near_miss(revoked: TrustedIdentity, trusted: TrustedIdentity) -> bool:
    """A revocation written for a trusted line (the same identity, ignoring case) that can
    never match a certificate the trusted line matches (:func:`could_overlap`)."""
    same = normal_url(revoked.identity).casefold() == normal_url(trusted.identity).casefold()
    return same and revoked.regexp == trusted.regexp and not could_overlap(revoked, trusted)


def could_overlap(revoked: TrustedIdentity, trusted: TrustedIdentity) -> bool:
    """Whether a revocation line could ever match a certificate the trusted line matches: same
    issuer, no source field pinned to two values, and the identities not provably disjoint
    (an exact identity the other line does not match; two expressions are assumed to meet)."""
    if normal_issuer(revoked.issuer) != normal_issuer(trusted.issuer):
        return False
    if _pins_disjoint(revoked.source, trusted.source) or _pins_disjoint(
        trusted.source, revoked.source
    ):
        return False
    if not revoked.regexp:
        return _matches_san(trusted, revoked.identity)
    if not trusted.regexp:
        return _matches_san(revoked, trusted.identity)
    return True


def _pins_disjoint(one: tuple[tuple[str, str], ...], other: tuple[tuple[str, str], ...]) -> bool:
    """Whether an exact pin of ``one`` is refused by ``other``'s pin of the same field (exact
    or expression): no certificate can satisfy both. Two expressions are assumed to meet."""
    pins = dict(other)
    for field, value in one:
        if field.endswith(REGEXP_SUFFIX):
            continue
        for theirs in (field, field + REGEXP_SUFFIX):
            if theirs in pins and not _pin_matches(theirs, pins[theirs], value):
                return True
    return False
