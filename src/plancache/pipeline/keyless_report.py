"""Keyless signers in reports: who signed a bundle (identity, issuer) and where the
transparency log recorded it (index, time), for ``verify --json``, ``ls --json``, ``explain``
and the boot records. Only a verified bundle's facts are shown; an unverified one is described
by its claimed statement alone, never by the certificate it carries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ..trust import envelope as dsse
from ..trust.envelope import is_bundle
from ..trust.keyring.identities import IdentitySigner
from ..trust.keyring.identity_match import SOURCE_FIELDS
from ..trust.sealing import claimed_payload
from ..trust.statement import format_time


def keyless_facts(identities: Sequence[IdentitySigner]) -> list[dict[str, Any]]:
    """One object per keyless signer of a verified signature, with its :func:`source_facts`."""
    return [
        {
            "keyid": s.keyid,
            "name": s.name,
            "identity": s.identity,
            "issuer": s.issuer,
            "log_index": s.log_index,
            "log_time": format_time(s.log_time) if s.log_time else None,
            **source_facts(s),
        }
        for s in identities
    ]


def source_facts(signer: IdentitySigner) -> dict[str, str | None]:
    """The build the certificate was issued to (Fulcio's source repository, ref, build config
    and trigger extensions), each field null when the certificate does not state it: for a
    reusable workflow the SAN names the called workflow, these name who called it."""
    stated = dict(signer.source)
    return {field.replace("-", "_"): stated.get(field) for field in SOURCE_FIELDS}


def signed_by(
    names: Sequence[str], ids: Sequence[str], keyless: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``{"name", "keyid"}`` per signer, with ``identity``, ``issuer`` and ``log_index`` for a
    keyless one."""
    facts = {f["keyid"]: f for f in keyless}
    pairs: list[dict[str, Any]] = []
    for name, kid in zip(names, ids, strict=False):
        pair: dict[str, Any] = {"name": name, "keyid": kid}
        if kid in facts:
            fact = facts[kid]
            pair.update(
                identity=fact["identity"], issuer=fact["issuer"], log_index=fact["log_index"]
            )
        pairs.append(pair)
    return pairs


class Signed(Protocol):
    """What every verified kind carries of who signed it (a plan, a plan set, a compile-cache
    manifest, its headers): the names, their key ids, the keyless signers' facts."""

    @property
    def signers(self) -> tuple[str, ...]: ...

    @property
    def key_ids(self) -> tuple[str, ...]: ...

    @property
    def identities(self) -> tuple[IdentitySigner, ...]: ...


def signers_of(verified: Signed) -> list[dict[str, Any]]:
    """A verified value's :func:`signed_by`, whatever its kind: the one way a report or a boot
    record names who signed (a keyless signer by its identity, issuer and log index)."""
    return signed_by(verified.signers, verified.key_ids, keyless_facts(verified.identities))


UNVERIFIED_KEYLESS = "sigstore (unverified)"
"""How an envelope's keyless signature is named unverified: its certificate is not read before
it verifies, so no identity is shown for it."""


def claimed(sig_bytes: bytes) -> tuple[list[str], bytes]:
    """(key ids the signature object claims, its claimed payload), unverified: a bundle claims
    no key id, nor does an envelope's keyless signature (a signer is known only once
    verified)."""
    if is_bundle(sig_bytes):
        return ["sigstore bundle (unverified)"], claimed_payload(sig_bytes)
    env = dsse.decode(sig_bytes)
    return [
        UNVERIFIED_KEYLESS if s.ext is not None else s.keyid for s in env.signatures
    ], env.payload
