"""The trusted-keys file: its text format, read into a :class:`~.keys.Keyring`.

Trusted-keys files are ``authorized_keys``-shaped, one key per line::

    # comment
    ssh-ed25519 AAAAC3Nz… ci-signer                          (a keygen .pub line as it is)
    name=ci,valid-after=2026-01-01T00:00:00Z,valid-before=2027-01-01T00:00:00Z ssh-ed25519 AAAA…
    @revoked SHA256:3q2+7w… [comment]                        (a key id, with or without '=', or)
    @revoked ssh-ed25519 AAAA… old-laptop                    (a whole key line, in any of the
                                                             key-line formats below)
    -----BEGIN PUBLIC KEY-----                               (PEM public keys, anywhere)
    …
    -----END PUBLIC KEY-----
    ci@acme namespaces="plancache" ssh-ed25519 AAAA…        (OpenSSH allowed_signers lines,
                                                             see :mod:`.allowed_signers`)
    sigstore issuer=URL identity=SAN                         (keyless signers: :mod:`.identities`)

What a key's window and ``@revoked`` mean is :mod:`.keys`'s. Every line must parse: a line that
does not, a key listed twice, or a window that holds no moment is a :class:`ConfigError` naming
``file:line``, never a line quietly skipped. The marker is exactly ``@revoked``: any other first
word starting with ``@`` (``@revoke``, ``@REVOKED``, ``@revoked:``) and a key named or principal
spelled like it (``revoked``, any case) are errors too, because each of them once trusted the
very key its author meant to revoke (under the name ``@revoke``). Split from :mod:`.keys` by
what these share: text, lines and their errors, where that module holds the keys themselves.
Parsing here is pure; reading files lives in :mod:`plancache.keys`.
"""

from __future__ import annotations

import unicodedata

from ..display import safe_text
from ..errors import ConfigError, PlanCacheError
from ..statement import parse_time
from .allowed_signers import parse_allowed_signer, spelled_like_marker
from .identities import IdentityPolicy, identity_entry
from .keyformat import (
    KEYID_PREFIX,
    PEM_PUBLIC_BEGIN,
    PEM_PUBLIC_END,
    SSH_KEY_TYPES,
    canonical_keyid,
    key_id,
    parse_openssh_public,
    parse_pem_public,
)
from .keys import Keyring, TrustedKey

MAX_KEYS = 1024

_OPTIONS = ("name", "valid-after", "valid-before")


def _parse_options(text: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or key not in _OPTIONS or key in options:
            raise ConfigError(
                f"unknown or repeated option '{safe_text(part, 40)}' (use {', '.join(_OPTIONS)})"
            )
        options[key] = value.strip('"')
    return options


def _revoked_id(rest: str) -> str:
    """What follows ``@revoked``: a key id (``SHA256:… [comment]``) or a key line in any format a
    key is trusted in (``[options] ssh-ed25519 AAAA… [comment]``, an allowed_signers line), so a
    line is revoked by prefixing it, whatever its namespaces."""
    fields = rest.split()
    if fields and fields[0].startswith(KEYID_PREFIX):
        kid = canonical_keyid(fields[0])
        if kid is None:
            raise ConfigError(
                f"'{safe_text(fields[0], 60)}' is not a key id (SHA256: and 43 base64 characters)"
            )
        return kid
    if len(fields) < 2:
        raise ConfigError("@revoked takes a key id (SHA256:…) or a key line")
    if fields[0] in SSH_KEY_TYPES or "=" in fields[0]:
        return _key_line(fields).keyid
    entry = parse_allowed_signer(rest, any_namespace=True)
    assert entry is not None  # any_namespace: a parsed line always has a key
    return key_id(entry.public)


_UNPRINTABLE = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def check_key_name(name: str, what: str = "the key's name") -> str:
    """A name written after a key (``keygen``'s comment, ``pubkey --name``): one line of
    printable text (UTF-8 is fine) without surrounding spaces, and not spelled like the
    revocation marker, so the line it ends reads back as the same trusted key, named so.

    Raises:
        ConfigError: not one line of printable text without surrounding spaces, or spelled like
            the revocation marker (reason ``config-error``); ``what`` names the value.
    """
    if name != name.strip() or any(unicodedata.category(c) in _UNPRINTABLE for c in name):
        raise ConfigError(
            f"{what} must be one line of printable text without leading or trailing spaces"
        )
    if spelled_like_marker(name):
        raise ConfigError(
            f"{what} '{safe_text(name, 60)}' is spelled like the revocation marker (revoke, "
            "revoked): a trusted-keys file would refuse the line; choose another"
        )
    return name


def _key_line(fields: list[str]) -> TrustedKey:
    """``[options] ssh-ed25519 AAAA… [name]``; a window must hold at least one moment."""
    options = _parse_options(fields[0]) if "=" in fields[0] else {}
    fields = fields[1:] if options else fields
    if len(fields) < 2:
        raise ConfigError("expected 'ssh-ed25519 AAAA… [name]'")
    public = parse_openssh_public(fields[0], fields[1])
    kid = key_id(public)
    name = options.get("name") or " ".join(fields[2:]) or kid[:15]
    after = parse_time(options["valid-after"], "valid-after") if "valid-after" in options else None
    before = (
        parse_time(options["valid-before"], "valid-before") if "valid-before" in options else None
    )
    if after is not None and before is not None and after >= before:
        raise ConfigError("valid-after is not before valid-before: the key would never count")
    return TrustedKey(kid, name, public, after, before)


def _pem_key(lines: list[str], start: int) -> tuple[TrustedKey, int]:
    """The PEM block opening at ``lines[start]``; returns the key and the index of its END line."""
    for end in range(start + 1, len(lines)):
        if lines[end].strip() == PEM_PUBLIC_END:
            block = "\n".join(line.strip() for line in lines[start : end + 1]) + "\n"
            public = parse_pem_public(block.encode("ascii", "replace"))
            kid = key_id(public)
            return TrustedKey(kid, kid[:15], public), end
    raise ConfigError(f"{PEM_PUBLIC_BEGIN} without {PEM_PUBLIC_END}")


def _allowed_signer(line: str) -> TrustedKey | None:
    entry = parse_allowed_signer(line)
    if entry is None:
        return None
    kid = key_id(entry.public)
    return TrustedKey(kid, entry.principals, entry.public, entry.valid_after, entry.valid_before)


def _entry(lines: list[str], index: int) -> tuple[TrustedKey | str | None, int]:
    """The entry at ``lines[index]``: a key, a revoked id, or None; and the last line it used.

    A line is plancache's own syntax when it starts with a key type, ``@revoked`` or an
    option list (``name=…``); any other first field is an allowed_signers principal.
    """
    line = lines[index].strip()
    if not line or line.startswith("#"):
        return None, index
    if line == PEM_PUBLIC_BEGIN:
        return _pem_key(lines, index)
    if line.startswith("-----BEGIN "):
        raise ConfigError(
            f"'{safe_text(line, 60)}' is not a public key (a private key does not belong here)"
        )
    fields = line.split()
    if fields[0] == "@revoked":
        return _revoked_id(line[len("@revoked") :]), index
    if fields[0].startswith("@"):
        raise ConfigError(
            f"'{safe_text(fields[0], 40)}' is not a marker: only '@revoked' (exactly so) revokes "
            "a key"
        )
    key = (
        _key_line(fields)
        if fields[0] in SSH_KEY_TYPES or "=" in fields[0]
        else _allowed_signer(line)
    )
    if key is not None and spelled_like_marker(key.name):
        raise ConfigError(
            f"key name '{safe_text(key.name, 60)}' is spelled like the revocation marker: to "
            "revoke the key, start the line with '@revoked'; to trust it, name it otherwise"
        )
    return key, index


def parse_trusted_keys(text: str, source: str) -> Keyring:
    """Parse a trusted-keys file (format in the module docstring). Every line counts.

    The keyring may hold revocations only; whether that is enough is the caller's decision
    (verifying needs a key, pruning revoked plans does not).

    Raises:
        ConfigError: a line that does not parse (a key or a ``sigstore`` identity), a key listed
            twice, a window that holds no moment, a marker or name spelled like ``@revoked`` but
            not exactly it, a sigstore revocation spelled like a trusted line that can never
            match it, more than :data:`MAX_KEYS` keys (reason ``config-error``; the detail
            names ``source:line``).
    """
    source = safe_text(source, 120)
    lines = text.split("\n")  # as editors number lines: not at \x85 or U+2028 inside a name
    keys: dict[str, TrustedKey] = {}
    listed_at: dict[str, int] = {}
    revoked: set[str] = set()
    ids: IdentityPolicy | None = None
    index = 0
    while index < len(lines):
        where = f"{source}:{index + 1}"
        try:
            ids, is_identity = identity_entry(lines[index], ids, _parse_options)
            entry, last = (None, index) if is_identity else _entry(lines, index)
        except PlanCacheError as exc:
            raise ConfigError(f"{where}: {exc.detail.removeprefix('statement: ')}") from None
        if isinstance(entry, str):
            revoked.add(entry)
        elif entry is not None:
            if entry.keyid in keys:
                raise ConfigError(
                    f"{where}: key {entry.keyid} is already listed at line {listed_at[entry.keyid]}"
                )
            keys[entry.keyid] = entry
            listed_at[entry.keyid] = index + 1
            if len(keys) > MAX_KEYS:
                raise ConfigError(f"{source}: more than {MAX_KEYS} keys")
        index = last + 1
    if ids is not None:
        try:
            ids.check_revocations()
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc.detail}") from None
    return Keyring({k: v for k, v in keys.items() if k not in revoked}, frozenset(revoked), 1, ids)
