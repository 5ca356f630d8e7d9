"""How plan sets are named in a store: ids every rank computes, names a listing is read by.

A set's name is computable from the configuration alone (every rank knows every rank's
fingerprint), so a node asks for one object by name and never lists; a listing's names are
hostile, so only exact names are read back. Split from :mod:`.plan_set` (the signed object and
its verification) by what these share: names and ids, needed before any signature exists and
wherever a store is listed (storage, push, prune, the plugin), with no key, envelope or clock.
Pure.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from ..display import safe_text
from ..errors import ConfigError, Reason, Rejected
from .plan import is_fingerprint

SET_PREFIX = "startup_planset_"
SET_SUFFIX = ".set"
MAX_MEMBERS = 64
"""Ranks one set may hold (a world of 64 GPUs); the signed statement stays under a KMS's 4 KiB."""

MAX_REPLICAS = 64
"""Copies of one set a push may write (Azure serves about 500 requests per second per blob)."""

_SET_NAME = re.compile(r"startup_planset_([0-9a-f]{16})\.set")
_REPLICA_NAME = re.compile(r"startup_planset_([0-9a-f]{16})\.r([1-9][0-9]?)\.set")
_DOMAIN = b"plancache-plan-set/v1\n"


def set_id(fingerprints: Sequence[str]) -> str:
    """The set's id for the member fingerprints in rank order (duplicates kept once, first place).

    Every rank computes the same id from the configuration alone: 16 hex of a domain-separated
    sha256 over the ordered list, so another order or another member is another name."""
    members = members_of(fingerprints)
    return hashlib.sha256(_DOMAIN + "\n".join(members).encode("ascii")).hexdigest()[:16]


def members_of(fingerprints: Sequence[str]) -> list[str]:
    """The distinct fingerprints in first-seen order, each a valid fingerprint.

    Raises:
        Rejected: not 1 to :data:`MAX_MEMBERS` distinct fingerprints, or one that is no
            fingerprint (reason ``malformed``).
    """
    members = list(dict.fromkeys(fingerprints))
    if not 1 <= len(members) <= MAX_MEMBERS or not all(is_fingerprint(fp) for fp in members):
        raise Rejected(Reason.MALFORMED, f"a plan set holds 1 to {MAX_MEMBERS} valid fingerprints")
    return members


def set_name(fingerprints: Sequence[str]) -> str:
    """The store object's name for these ranks' fingerprints: computable by any rank."""
    return f"{SET_PREFIX}{set_id(fingerprints)}{SET_SUFFIX}"


def set_id_of_name(name: str) -> str | None:
    """The id in an exact set object name, else None (hostile listings are ignored)."""
    match = _SET_NAME.fullmatch(name)
    return match.group(1) if match else None


def replica_name(name: str, index: int) -> str:
    """Copy ``index`` of set ``name`` (0: the set itself). A replica holds the set's exact bytes
    and is verified under the set's own name, so a copy that differs is refused as tampered.

    Raises:
        ConfigError: ``name`` is no set object name, or ``index`` is outside 0 to
            ``MAX_REPLICAS - 1`` (reason ``config-error``).
    """
    ident = set_id_of_name(name)
    if ident is None or not 0 <= index < MAX_REPLICAS:
        raise ConfigError(
            f"no replica {index} of '{safe_text(name, 80)}' (0 to {MAX_REPLICAS - 1})"
        )
    return name if index == 0 else f"{SET_PREFIX}{ident}.r{index}{SET_SUFFIX}"


def set_object_id(name: str) -> tuple[str, int] | None:
    """(set id, replica index) of a set or replica object name, else None."""
    ident = set_id_of_name(name)
    if ident is not None:
        return ident, 0
    match = _REPLICA_NAME.fullmatch(name)
    if match is None or int(match.group(2)) >= MAX_REPLICAS:
        return None
    return match.group(1), int(match.group(2))
