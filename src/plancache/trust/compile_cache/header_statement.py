"""The signed companion of a compile cache: the precompiled C++ headers its build node used.

Inductor (torch 2.13) builds a precompiled header (``<hash>.h.gch``, ~149 MiB of gcc output,
11-60 s of gcc) before it loads even a warm cache; a new node would build it on its first boot.
The build node ships the header(s) its compile used as one gzip stream beside the cache, with
this statement, signed separately from the cache's closed-world manifest so that an older
verifier (strict about the manifest's keys) still reads the cache, and a slow header never
costs a node the cache itself.

A header is code gcc consumes (``-include``), so the statement binds, for the cache ``subject``
it was built with: that cache's exact signature, as the ``archive_sha256`` its signed manifest
commits to (``cache_archive_sha256``: a header is installed only beside the cache it was made
for, never beside a newer one kept on the node or a later build's, and a statement without it,
an older plancache's, is refused as ``statement-mismatch``); the sha256 and size of the
compressed object (checked before a byte is inflated), and each header's name, size and sha256
(checked before it is installed). Names are
torch's content hashes: a serving node's torch asks for a header by the name *its* compiler,
flags and preprocessed headers hash to, so a header built elsewhere is simply never asked for.
The caps bound what a signer (or a store, before the digest check) can make a node inflate:
sizes, count, and the ratio of inflated to compressed bytes (gzip at level 1 gives 5.7x here).
No IO here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeGuard

from ..display import safe_text
from ..envelope import keyless_cap
from ..errors import ConfigError, Reason, Rejected
from ..keyring.identities import IdentitySigner
from ..keyring.keys import Keyring, Signer
from ..keyring.signatories import DEFAULT_CLOCK_SKEW
from ..sealing import seal
from ..statement import format_time, parse_time, render_statement, statement_shell
from ..verify import SignedKind, open_signed
from .manifest import is_subject

PREDICATE_TYPE = "https://plancache.dev/compile-headers/v1"
MAX_HEADERS = 8
MAX_HEADER_BYTES = 1 << 30
MAX_TOTAL_BYTES = 2 << 30
MAX_RATIO = 64
"""Inflated bytes per compressed byte a statement may claim (a real .gch: 5.7 at gzip -1)."""
MAX_SIG_BYTES = 64 * 1024
MAX_SIG_OBJECT_BYTES = keyless_cap(MAX_SIG_BYTES)
"""What a reader reads of a headers signature at most (keyless signatures' allowance)."""

_HEX64 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[a-z0-9_]{1,128}\.h\.(gch|pch)")
"""torch's ``code_hash`` names (``c`` + base32) with gcc's or clang's suffix: no separator, no
dot first, so a name can only ever land directly inside the headers directory."""

_SEAL = object()


def is_header_name(name: object) -> TypeGuard[str]:
    """Whether ``name`` is a header name torch asks for (see :data:`_NAME`)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


@dataclass(frozen=True)
class HeaderEntry:
    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class HeaderSet:
    """What a headers statement says: the headers, in the order the gzip stream holds them."""

    subject: str
    headers: tuple[HeaderEntry, ...]
    object_sha256: str
    object_size: int
    signed_at: datetime
    expires_at: datetime | None = None
    cache_archive_sha256: str = field(kw_only=True)
    """The ``archive_sha256`` of the cache manifest these headers were built beside: what that
    cache's signature commits to, so the headers follow exactly that signed cache."""

    @property
    def total_size(self) -> int:
        return sum(h.size for h in self.headers)

    def to_json_bytes(self) -> bytes:
        predicate = {
            "cache_archive_sha256": self.cache_archive_sha256,
            "expires_at": format_time(self.expires_at) if self.expires_at else None,
            "headers": [[h.name, h.size, h.sha256] for h in self.headers],
            "object": {"sha256": self.object_sha256, "size": self.object_size},
            "signed_at": format_time(self.signed_at),
        }
        return render_statement(
            self.subject,
            sha256=self.object_sha256,
            predicate_type=PREDICATE_TYPE,
            predicate=predicate,
        )


@dataclass(frozen=True)
class VerifiedHeaders:
    """A headers statement whose signature verified. Only :func:`verify_headers` makes these."""

    headers: HeaderSet
    signers: tuple[str, ...]
    _seal: object = None
    key_ids: tuple[str, ...] = ()
    """Key ids of the signers, in the order of ``signers`` (as a verified plan's)."""
    identities: tuple[IdentitySigner, ...] = ()
    """Keyless signers (identity, issuer, log index), among ``signers``."""

    def __post_init__(self) -> None:
        if self._seal is not _SEAL:
            raise TypeError(
                "VerifiedHeaders is created by plancache.trust.compile_cache.header_statement only"
            )


def _int(value: object, what: str, *, low: int, cap: int) -> int:
    if type(value) is not int or not low <= value <= cap:
        raise Rejected(
            Reason.MALFORMED, f"headers statement: {what} is not a whole number in {low}…{cap}"
        )
    return value


def check_headers(hset: HeaderSet) -> HeaderSet:
    """The rules every headers statement obeys, signing and verifying alike.

    Raises:
        Rejected: ``malformed`` (a subject that is no cache directory name, a header name not
            torch's or repeated, a size or sha256 off its form), ``too-large`` (not 1 to
            :data:`MAX_HEADERS` headers, more than :data:`MAX_TOTAL_BYTES` in all, or an
            inflation ratio over :data:`MAX_RATIO`).
    """
    if not is_subject(hset.subject):
        raise Rejected(
            Reason.MALFORMED,
            f"headers subject '{safe_text(hset.subject, 100)}' is not a cache directory name",
        )
    if not 1 <= len(hset.headers) <= MAX_HEADERS:
        raise Rejected(
            Reason.TOO_LARGE,
            f"a headers statement lists 1…{MAX_HEADERS} headers, not {len(hset.headers)}",
        )
    names = [h.name for h in hset.headers]
    if not all(map(is_header_name, names)) or len(set(names)) != len(names):
        raise Rejected(
            Reason.MALFORMED, "headers statement: a header name is not torch's, or repeated"
        )
    for entry in hset.headers:
        _int(entry.size, "a header size", low=1, cap=MAX_HEADER_BYTES)
        if not _HEX64.fullmatch(entry.sha256):
            raise Rejected(
                Reason.MALFORMED, "headers statement: a sha256 is not 64 lowercase hex digits"
            )
    if not _HEX64.fullmatch(hset.object_sha256):
        raise Rejected(
            Reason.MALFORMED, "headers statement: the object sha256 is not 64 lowercase hex digits"
        )
    archive: object = hset.cache_archive_sha256  # parse_headers passes what the JSON held
    if not isinstance(archive, str) or not _HEX64.fullmatch(archive):
        raise Rejected(
            Reason.MALFORMED,
            "headers statement: the cache's archive sha256 is not 64 lowercase hex digits",
        )
    _int(hset.object_size, "the object size", low=1, cap=MAX_TOTAL_BYTES)
    if hset.total_size > MAX_TOTAL_BYTES:
        raise Rejected(
            Reason.TOO_LARGE, f"headers total {hset.total_size} bytes, the cap is {MAX_TOTAL_BYTES}"
        )
    if hset.total_size > MAX_RATIO * hset.object_size:
        raise Rejected(
            Reason.TOO_LARGE,
            f"headers inflate {hset.total_size} bytes from {hset.object_size}: "
            f"more than {MAX_RATIO}x (a gzip bomb?)",
        )
    return hset


def sign_headers(hset: HeaderSet, signer: Signer) -> bytes:
    """The signature object's bytes: a DSSE envelope over the statement, signed by ``signer``.

    Raises:
        Rejected: the statement breaks :func:`check_headers`'s rules (``malformed``,
            ``too-large``).
        ConfigError: an expiry not after ``signed_at``, a time outside the calendar, or a
            remote key that refuses to sign (reason ``config-error``).
        StoreTimeout: a remote key did not answer within its budget (reason ``timeout``).
    """
    check_headers(hset)
    if hset.expires_at is not None and hset.expires_at <= hset.signed_at:
        raise ConfigError("the expiry must lie in the future")
    payload = hset.to_json_bytes()
    return seal(payload, signer)


_KEYS = {"cache_archive_sha256", "expires_at", "headers", "object", "signed_at"}
_UNBOUND_KEYS = _KEYS - {"cache_archive_sha256"}
"""An older plancache's statement: bound to the cache's name only (so a node would take an older
header beside a newer cache). An older verifier, exact about keys, refuses the new statement as
``malformed`` in turn: either way torch builds the header, nothing older is installed."""


def parse_headers(payload: bytes) -> HeaderSet:
    """Parse a (signature-verified) statement strictly: exact keys, exact types.

    Raises:
        Rejected: ``statement-mismatch`` (an older plancache's statement, bound to no cache
            signature), ``malformed`` (any other deviation from the schema), ``too-large``
            (more headers than :data:`MAX_HEADERS`, or :func:`check_headers`'s caps).
    """
    name, sha256, pred = statement_shell(
        payload, "headers statement", predicate_type=PREDICATE_TYPE
    )
    if set(pred) == _UNBOUND_KEYS:
        raise Rejected(
            Reason.STATEMENT_MISMATCH,
            "the headers statement binds no cache signature (an older "
            "plancache's): not installed, torch builds the header",
        )
    if set(pred) != _KEYS:
        raise Rejected(
            Reason.MALFORMED,
            "headers predicate must have exactly cache_archive_sha256, expires_at, "
            "headers, object, signed_at",
        )
    target, items = pred["object"], pred["headers"]
    if (
        not isinstance(target, dict)
        or set(target) != {"sha256", "size"}
        or target["sha256"] != sha256
    ):
        raise Rejected(
            Reason.MALFORMED,
            "headers object must have exactly sha256 (the subject's digest) and size",
        )
    if not isinstance(items, list) or len(items) > MAX_HEADERS:
        raise Rejected(Reason.TOO_LARGE, f"a headers statement lists at most {MAX_HEADERS} headers")
    entries = []
    for item in items:
        if not (
            isinstance(item, list)
            and len(item) == 3
            and isinstance(item[0], str)
            and isinstance(item[2], str)
        ):
            raise Rejected(
                Reason.MALFORMED, "headers statement: each header is [name, size, sha256]"
            )
        entries.append(
            HeaderEntry(
                item[0], _int(item[1], "a header size", low=1, cap=MAX_HEADER_BYTES), item[2]
            )
        )
    expires = pred["expires_at"]
    return check_headers(
        HeaderSet(
            subject=name,
            headers=tuple(entries),
            object_sha256=sha256,
            object_size=_int(target["size"], "the object size", low=1, cap=MAX_TOTAL_BYTES),
            signed_at=parse_time(pred["signed_at"], "signed_at"),
            expires_at=None if expires is None else parse_time(expires, "expires_at"),
            cache_archive_sha256=pred["cache_archive_sha256"],
        )
    )


HEADERS_SIGNATURE = SignedKind(parse_headers, lambda h: h.subject, "headers are", MAX_SIG_BYTES)
"""A headers statement's signature: the statement names the cache directory."""


def check_binding(hset: HeaderSet, cache_archive_sha256: str | None) -> None:
    """The headers may go beside the cache whose signed manifest commits to
    ``cache_archive_sha256`` only if they were made for it. Not ``digest-mismatch`` for any
    other: no byte was altered; the statement, intact, is about another cache.

    Raises:
        Rejected: the headers were made for another cache (an older build's header beside a
            newer cache, a newer one beside an older cache kept on the node), or no cache is
            named (reason ``statement-mismatch``).
    """
    if cache_archive_sha256 is None or hset.cache_archive_sha256 != cache_archive_sha256:
        this = (
            f"this node's ({cache_archive_sha256[:16]}…)"
            if cache_archive_sha256
            else "an unnamed one"
        )
        raise Rejected(
            Reason.STATEMENT_MISMATCH,
            f"the headers were made for the cache signed as archive "
            f"{hset.cache_archive_sha256[:16]}…, not for {this}: not installed",
        )


def verify_headers(
    subject: str,
    sig_bytes: bytes | None,
    keyring: Keyring,
    now: datetime,
    *,
    cache_archive_sha256: str | None,
    clock_skew: timedelta = DEFAULT_CLOCK_SKEW,
) -> VerifiedHeaders:
    """Verify the headers signature for cache ``subject`` and the cache signature they are bound
    to (:func:`check_binding`); the verified statement or a typed error. ``cache_archive_sha256``
    None (named, never defaulted): the cache is not decided yet (a fetch beside the guard's
    pull), and the caller must :func:`check_binding` before it installs a byte.

    Raises:
        Rejected: ``unsigned`` (no signature), then :func:`~..verify.open_signed`'s reasons in
            its order: the signatures' (``too-large``, ``malformed``, ``revoked``,
            ``bad-signature``, ``untrusted-key``, the keyless ones), :func:`parse_headers`'s
            (``statement-mismatch``, ``malformed``, ``too-large``), ``name-mismatch`` (the
            headers of another cache directory), the signers' (``expired``,
            ``threshold-not-met``, ``not-yet-valid``); and :func:`check_binding`'s
            ``statement-mismatch``.
    """
    if sig_bytes is None:
        raise Rejected(Reason.UNSIGNED, "no headers signature")
    opened = open_signed(
        sig_bytes, keyring, HEADERS_SIGNATURE, subject, now=now, clock_skew=clock_skew
    )
    if cache_archive_sha256 is not None:
        check_binding(opened.statement, cache_archive_sha256)
    return VerifiedHeaders(opened.statement, opened.names, _SEAL, opened.key_ids, opened.identities)
