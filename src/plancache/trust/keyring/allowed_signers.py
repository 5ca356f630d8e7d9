"""OpenSSH ``allowed_signers`` lines in a trusted-keys file (what ``ssh-keygen -Y verify`` and
git's SSH signing read), so one file can serve both tools::

    ci@acme.example namespaces="plancache",valid-after="20260101Z" ssh-ed25519 AAAA… comment
    "alice@acme.example,bob@*" ssh-ed25519 AAAA…

Fields: principals (a comma-separated pattern list, possibly quoted), optional options, the
key. plancache verifies keys, not principals: the principals become the key's name in
reports. What the options mean here:

- ``namespaces="…"``: the pattern list of signature namespaces the key may sign for.
  plancache's namespace is :data:`NAMESPACE`; a key whose list does not match it trusts
  nothing here (its line is parsed, then skipped), exactly as ``ssh-keygen -Y verify -n
  plancache`` would refuse it. Without the option a key may sign for any namespace.
- ``valid-after`` / ``valid-before``: OpenSSH's ``YYYYMMDD[HHMM[SS]]`` with a ``Z``. OpenSSH
  reads a time without ``Z`` in the verifier's local time zone; a fleet spans time zones, so
  the same file would open a key at different moments on different machines. Such a time is
  refused with one line instead of guessed.
- ``cert-authority``: refused with one line. A CA line trusts every key the CA certified,
  and plancache's sidecars carry bare signatures, no certificates.

Any other option is refused: an option ignored is a restriction silently dropped. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..display import safe_text
from ..errors import ConfigError
from .keyformat import SSH_KEY_TYPES, parse_openssh_public

NAMESPACE = "plancache"
"""The namespace plancache signatures are made for (``ssh-keygen -Y sign -n plancache``)."""

_TIME = re.compile(r"([0-9]{8})(?:([0-9]{4})([0-9]{2})?)?(Z?)")
_OPTIONS = ("namespaces", "valid-after", "valid-before", "cert-authority")


@dataclass(frozen=True)
class AllowedSigner:
    principals: str
    public: Ed25519PublicKey
    valid_after: datetime | None
    valid_before: datetime | None


def tokens(line: str) -> list[str]:
    """Whitespace-separated fields where double quotes keep spaces (``namespaces="a, b"``).

    Raises:
        ConfigError: a quote is left open (reason ``config-error``).
    """
    fields: list[str] = []
    current: list[str] = []
    quoted = False
    for char in line:
        if char == '"':
            quoted = not quoted
        if char.isspace() and not quoted:
            if current:
                fields.append("".join(current))
                current = []
            continue
        current.append(char)
    if quoted:
        raise ConfigError("unterminated quote")
    if current:
        fields.append("".join(current))
    return fields


def _split_options(text: str) -> dict[str, str | None]:
    """``a="x,y",b`` -> {a: "x,y", b: None}: commas inside quotes do not split."""
    options: dict[str, str | None] = {}
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    for char in text:
        if char == '"':
            quoted = not quoted
        if char == "," and not quoted:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    for part in parts:
        key, sep, value = part.partition("=")
        key = key.lower()
        if key not in _OPTIONS or key in options:
            raise ConfigError(
                f"unknown or repeated allowed_signers option '{safe_text(part, 40)}' "
                f"(use {', '.join(_OPTIONS)})"
            )
        options[key] = value.strip('"') if sep else None
    return options


def parse_openssh_time(value: str, what: str) -> datetime:
    """``YYYYMMDD[HHMM[SS]]Z`` (UTC) as OpenSSH writes it; see the module docstring for why a
    time without ``Z`` is refused.

    Raises:
        ConfigError: not that form, no ``Z``, or no valid date (reason ``config-error``).
    """
    match = _TIME.fullmatch(value)
    if not match:
        raise ConfigError(f"{what}='{safe_text(value, 30)}' is not YYYYMMDD[HHMM[SS]]Z")
    date, hhmm, ss, zulu = match.groups()
    if not zulu:
        raise ConfigError(
            f"{what}={safe_text(value, 30)} has no Z: OpenSSH would read it in local time; "
            f"write {value}Z for UTC"
        )
    try:
        return datetime(
            int(date[:4]),
            int(date[4:6]),
            int(date[6:8]),
            int(hhmm[:2]) if hhmm else 0,
            int(hhmm[2:]) if hhmm else 0,
            int(ss) if ss else 0,
            tzinfo=timezone.utc,
        )
    except ValueError:
        raise ConfigError(f"{what}={safe_text(value, 30)} is not a valid date") from None


def matches_pattern_list(name: str, patterns: str) -> bool:
    """OpenSSH's ``match_pattern_list``: comma-separated ``*``/``?`` patterns; a matching
    ``!pattern`` excludes whatever else matches."""
    found = False
    for pattern in patterns.split(","):
        negated = pattern.startswith("!")
        body = pattern[1:] if negated else pattern
        regex = re.escape(body).replace(r"\*", ".*").replace(r"\?", ".")
        if re.fullmatch(regex, name, re.DOTALL):
            if negated:
                return False
            found = True
    return found


MARKER_WORDS = ("revoke", "revoked")


def spelled_like_marker(name: str) -> bool:
    """Whether a principal or key name reads as the revocation marker: a word (split at spaces
    and commas) that is ``revoke`` or ``revoked`` in any case, with any punctuation around it
    (``@REVOKED``, ``revoked:``, ``!revoke``). Such a line was meant to revoke; trusting its key
    under that name would do the opposite, so it is a configuration error instead."""
    words = re.split(r"[\s,]+", name.lower())
    return any(re.sub(r"^[^a-z0-9]+|[^a-z0-9]+$", "", word) in MARKER_WORDS for word in words)


def parse_allowed_signer(line: str, any_namespace: bool = False) -> AllowedSigner | None:
    """One ``principals [options] ssh-ed25519 AAAA… [comment]`` line; None when its
    ``namespaces`` do not include plancache's (the line trusts nothing here), unless
    ``any_namespace`` (a revocation voids the key whatever it may sign for).

    Raises:
        ConfigError: not a key line nor an allowed_signers line, an unknown or repeated option,
            a ``cert-authority`` line, a key that is not a valid ssh-ed25519 key, a time not
            OpenSSH's UTC form, a window that holds no moment, ``namespaces`` without a value
            (reason ``config-error``).
    """
    fields = tokens(line)
    if len(fields) >= 3 and fields[1] in SSH_KEY_TYPES:
        principals, options, key_fields = fields[0], {}, fields[1:]
    elif len(fields) >= 4 and fields[2] in SSH_KEY_TYPES:
        principals, options, key_fields = fields[0], _split_options(fields[1]), fields[2:]
    else:
        raise ConfigError(
            "expected 'ssh-ed25519 AAAA… [name]' or an allowed_signers line "
            "'principals [options] ssh-ed25519 AAAA…'"
        )
    if "cert-authority" in options:
        raise ConfigError("cert-authority lines are not supported: list each signing key itself")
    public = parse_openssh_public(key_fields[0], key_fields[1])
    after = (
        parse_openssh_time(options["valid-after"] or "", "valid-after")
        if "valid-after" in options
        else None
    )
    before = (
        parse_openssh_time(options["valid-before"] or "", "valid-before")
        if "valid-before" in options
        else None
    )
    if after is not None and before is not None and after >= before:
        raise ConfigError("valid-after is not before valid-before: the key would never count")
    namespaces = options.get("namespaces", "*")
    if namespaces is None:
        raise ConfigError('namespaces needs a value, e.g. namespaces="plancache"')
    if not any_namespace and not matches_pattern_list(NAMESPACE, namespaces):
        return None
    return AllowedSigner(principals.strip('"'), public, after, before)
