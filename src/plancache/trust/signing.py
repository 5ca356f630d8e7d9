"""Making and extending signatures: the producer side of :mod:`plancache.trust.verify`.

Signing refuses a plan that would not pass the strict parser: a signature is a promise that
the numbers are sane, so it is never put on bytes the verifier would reject anyway.

Co-signing is the dangerous direction. A sidecar comes from a directory or a store, so its
statement is attacker-chosen until shown otherwise: co-signing it blindly would give a planted
statement (no expiry, a backdated ``signed_at``, chosen conditions) the signer's name. So
:func:`sign_or_cosign` adopts a statement only if trusted keys or identities already vouch for
it and it says what a fresh signature would say; and nothing leaves it that does not verify
under the signer's own keyring. Keys and keyless signers co-sign alike, in any mix: one
envelope holds them all (:func:`~.sealing.cosign`), so a threshold above 1 can be met by a key
and a CI identity, or by two identities.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from . import envelope as dsse
from .errors import ConfigError, Reason, Rejected
from .inputs import check_inputs, fingerprint_of_inputs
from .keyring.keys import Keyring, Signer, signer_keyring
from .keyring.signatories import open_envelope
from .plans.evidence import check_evidence, refuse_impossible
from .plans.plan import parse_plan
from .sealing import as_envelope, cosign, seal
from .statement import (
    Statement,
    check_measurements,
    check_provenance,
    format_time,
    parse_statement,
    signable_provenance,
)
from .verify import VerifiedPlan, verify_plan

REWRITTEN = "the plan changed since it was signed (re-profiled?); --replace signs the new bytes"
"""Advice for a sidecar over earlier bytes of the plan: co-signing cannot help, replacing does."""

Action = Literal["signed", "co-signed", "kept", "replaced"]

MAX_SIGNED_BYTES = 4096
"""Cap on the signed message (the DSSE PAE over the statement). AWS KMS signs Ed25519 only over
a raw message of at most 4096 bytes, and a statement that one key backend cannot sign could
never be co-signed or rotated onto such a key later: so every statement fits, whatever the key."""


def _signable(payload_type: str, payload: bytes) -> bytes | None:
    """The PAE to sign, or None when it is over :data:`MAX_SIGNED_BYTES`."""
    data = dsse.pae(payload_type, payload)
    return data if len(data) <= MAX_SIGNED_BYTES else None


def sign_plan(
    name: str,
    plan_bytes: bytes,
    signer: Signer,
    now: datetime,
    *,
    expires_at: datetime | None = None,
    comment: str = "",
    provenance: Mapping[str, Any] | None = None,
    inputs: Mapping[str, Any] | None = None,
    measurements: Mapping[str, Any] | None = None,
    config_parts: Mapping[str, Any] | None = None,
    evidence: Mapping[str, Any] | None = None,
) -> bytes:
    """Return the sidecar bytes: a DSSE envelope over a fresh statement for this exact plan.

    ``evidence`` says how it was measured; impossible numbers are refused first, each with its
    own reason (:func:`~.evidence.refuse_impossible`).

    ``inputs`` (the fingerprint's inputs, :mod:`.inputs`) are signed only if they reproduce the
    plan's fingerprint with vLLM's digest: a signed input is a promise of what was hashed;
    ``config_parts`` (each configuration part's hash) narrow a differing ``vllm_config`` input.

    Raises:
        Rejected: impossible numbers (``kv-not-positive``, ``baseline-below-kv``,
            ``kv-above-device-memory``); the plan fails the strict parser (``malformed``,
            ``too-large``, ``fingerprint-mismatch``); unknown or mistyped ``provenance``.
        ConfigError: the caller's values cannot be signed (reason ``config-error``): an expiry
            not in the future, ``inputs``, ``config_parts`` or ``measurements`` of the wrong
            shape, inputs that do not hash to the plan's fingerprint, a statement over the
            :data:`MAX_SIGNED_BYTES` cap, a time outside the calendar in UTC
            (:func:`~.statement.format_time`); or a remote key that refuses to sign.
        StoreTimeout: a remote key (HSM, KMS) did not answer within its budget (reason
            ``timeout``).
    """
    refuse_impossible(plan_bytes, (provenance or {}).get("device_total_memory"))
    plan = parse_plan(plan_bytes, name)
    if expires_at is not None and expires_at <= now:
        raise ConfigError("the expiry must lie in the future")
    try:
        checked_inputs = check_inputs(dict(inputs or {}), "fingerprint inputs")
        checked_measurements = check_measurements(measurements or {})
        checked_evidence = check_evidence(evidence or {})
        # configuration parts only beside the inputs they narrow down
        checked_parts = check_inputs(dict(config_parts or {}), "config parts") if inputs else {}
    except Rejected as exc:  # the caller's values, not a file's bytes
        raise ConfigError(exc.detail) from None
    if checked_inputs and fingerprint_of_inputs(checked_inputs) != plan.fingerprint:
        raise ConfigError(
            f"the fingerprint inputs hash to {fingerprint_of_inputs(checked_inputs)}, not to the "
            f"plan's {plan.fingerprint}: not signed as its inputs"
        )
    statement = Statement(
        subject_name=name,
        subject_sha256=hashlib.sha256(plan_bytes).hexdigest(),
        fingerprint=plan.fingerprint,
        signed_at=now,
        expires_at=expires_at,
        comment=comment,
        provenance=signable_provenance(provenance or {}),
        inputs=checked_inputs,
        config_parts=checked_parts,
        measurements=checked_measurements,
        evidence=checked_evidence,
    )
    payload = statement.to_json_bytes()
    data = _signable(dsse.PAYLOAD_TYPE, payload)
    if data is None:
        raise ConfigError(
            f"the statement to sign is {len(payload)} bytes; signed messages are capped at "
            f"{MAX_SIGNED_BYTES} bytes (what a KMS signs): shorten the comment or the provenance "
            "facts"
        )
    return seal(payload, signer)


def add_signature(name: str, plan_bytes: bytes, sig_bytes: bytes, signer: Signer) -> bytes:
    """Add ``signer``'s signature to an existing sidecar: same statement, one more signature.

    The low-level step, which judges only the bytes: the statement must describe these exact
    plan bytes, and the sidecar is kept as it is only if the signer's own signature in it
    verifies (its key id's, or a keyless signer's identity's); an entry under its key id that
    does not is replaced, never reported as done. A bundle becomes an envelope holding its
    signature beside the new one. Whether the statement deserves the signature is
    :func:`sign_or_cosign`'s question.

    Raises:
        Rejected: the sidecar is no canonical envelope, usable bundle or statement (reason
            ``malformed`` or ``too-large``, from :func:`~.sealing.as_envelope` and
            :func:`~.statement.parse_statement`); its statement names other bytes (reason
            ``digest-mismatch``); the plan fails the strict parser (``malformed``, ``too-large``,
            ``fingerprint-mismatch``); the statement is over the signing cap (``too-large``); the
            sidecar already holds the most signatures an envelope may (``malformed``).
        ConfigError: the signer's key id is not its key's, a remote key refuses to sign, or a
            keyless signer's bundle is over other bytes (reason ``config-error``).
        StoreTimeout: a remote key did not answer within its budget (reason ``timeout``).
    """
    env = as_envelope(sig_bytes)
    statement = parse_statement(env.payload)
    if (
        statement.subject_name != name
        or statement.subject_sha256 != hashlib.sha256(plan_bytes).hexdigest()
    ):
        raise Rejected(Reason.DIGEST_MISMATCH, "the existing signature is not for these plan bytes")
    parse_plan(plan_bytes, name)
    if _signable(env.payload_type, env.payload) is None:
        raise Rejected(
            Reason.TOO_LARGE,
            f"the existing statement is over the {MAX_SIGNED_BYTES}-byte signing cap "
            "(--replace signs anew)",
        )
    try:
        open_envelope(sig_bytes, signer_keyring(signer))
        return sig_bytes  # the signer's own signature is in it, and verifies
    except Rejected:
        return cosign(env, signer)


def _differences(
    statement: Statement | None,
    expires_at: datetime | None,
    comment: str | None,
    provenance: Mapping[str, Any] | None,
) -> str:
    """How ``statement`` differs from what this command would sign; "" if it does not."""
    if statement is None:  # only unsigned admission makes these, never verify_plan
        return "it carries no statement"
    if expires_at is not None and (
        statement.expires_at is None or statement.expires_at > expires_at
    ):
        held = (
            "no expiry"
            if statement.expires_at is None
            else f"expiry {format_time(statement.expires_at)}"
        )
        return f"it has {held}, later than the requested {format_time(expires_at)}"
    if comment is not None and statement.comment != comment:
        return "its comment differs from the requested one"
    if provenance is not None and dict(statement.provenance) != signable_provenance(provenance):
        return "its provenance facts differ from the requested ones"
    return ""


def sign_or_cosign(
    name: str,
    plan_bytes: bytes,
    sig_bytes: bytes | None,
    signer: Signer,
    now: datetime,
    *,
    keyring: Keyring | None,
    expires_at: datetime | None = None,
    comment: str | None = None,
    provenance: Mapping[str, Any] | None = None,
    replace: bool = False,
    inputs: Mapping[str, Any] | None = None,
    config_parts: Mapping[str, Any] | None = None,
    evidence: Mapping[str, Any] | None = None,
) -> tuple[Action, bytes]:
    """What ``plancache sign`` does to one plan: returns (action, the sidecar bytes to write).

    - no sidecar: ``signed``, a fresh statement;
    - this signer's signature in the sidecar verifies and the statement says what this
      command would sign: ``kept`` (the bytes are returned unchanged);
    - the statement verifies under ``keyring`` (one trusted key or identity suffices:
      co-signing is how a higher threshold is reached) and says what this command would sign:
      ``co-signed`` (a key's or a keyless signature added; a bundle becomes an envelope);
    - otherwise ``Rejected`` (one line, the sidecar is left alone), or with ``replace`` a
      fresh statement signed by this key alone: ``replaced``.

    "What this command would sign": expiry no later than ``expires_at`` (when given), and
    the same ``comment`` and ``provenance`` (each when given; None means this command names
    none, so the trusted statement's are kept, as a key rotation needs). A fresh statement
    uses "" and no facts for None; ``inputs`` (the fingerprint's inputs) and ``evidence`` go into a
    fresh statement only (an adopted one keeps its own). The result is verified with
    the signer's own keyring (its key, or its certified identity) before it is returned.

    Raises:
        ConfigError: the operator's request cannot be signed (reason ``config-error``): a
            signer whose key id is not its key's, an expiry not in the future, unknown or
            mistyped ``provenance`` facts, a signing key revoked in ``keyring``, what
            :func:`sign_plan` refuses of a fresh statement, a remote key that refuses to sign.
        Rejected: without ``replace``, the sidecar cannot be kept or co-signed, with the
            reason of what failed: ``statement-mismatch`` (it says something else than asked),
            ``digest-mismatch`` (it signs other bytes), ``untrusted-key`` (no valid signature of
            this key and no ``keyring``), or any reason :func:`~.verify.verify_plan` gives under
            ``keyring`` (``bad-signature``, ``revoked``, ``expired``, ``malformed``, ...); a plan
            the strict parser refuses (``malformed``, ``too-large``, ``fingerprint-mismatch``);
            the new sidecar not verifying with the signer's own key (the reason it failed with).
        StoreTimeout: a remote key did not answer within its budget (reason ``timeout``).
    """
    own = signer_keyring(signer)  # a signer whose key id is not its key's is a ConfigError
    if expires_at is not None and expires_at <= now:
        raise ConfigError("the expiry must lie in the future")
    try:
        check_provenance(provenance or {})
    except Rejected as exc:  # the operator's flags, not a file's bytes
        raise ConfigError(exc.detail) from None
    if keyring is not None and keyring.revokes(signer):
        raise ConfigError(f"the signing key {signer.keyid} is revoked in the trusted keys")

    def fresh() -> bytes:
        return sign_plan(
            name,
            plan_bytes,
            signer,
            now,
            expires_at=expires_at,
            comment=comment or "",
            provenance=provenance,
            inputs=inputs,
            config_parts=config_parts,
            evidence=evidence,
        )

    action: Action
    if sig_bytes is None:
        action, result = "signed", fresh()
    else:
        try:
            action, result = _adopt(
                name,
                plan_bytes,
                sig_bytes,
                signer=signer,
                own=own,
                keyring=keyring,
                now=now,
                expires_at=expires_at,
                comment=comment,
                provenance=provenance,
            )
        except Rejected:
            if not replace:
                raise
            action, result = "replaced", fresh()
    try:
        verify_plan(name, plan_bytes, result, own, now)
    except Rejected as exc:
        raise Rejected(
            exc.reason, f"the new signature does not verify with the signer's own key: {exc.detail}"
        ) from None
    return action, result


def _adopt(
    name: str,
    plan_bytes: bytes,
    sig_bytes: bytes,
    *,
    signer: Signer,
    own: Keyring,
    keyring: Keyring | None,
    now: datetime,
    expires_at: datetime | None,
    comment: str | None,
    provenance: Mapping[str, Any] | None,
) -> tuple[Action, bytes]:
    """Keep or co-sign the existing sidecar, or raise ``Rejected`` saying why not.

    Everything after the sidecar is named: ``own`` (the signer's key alone) and ``keyring``
    (the trusted keys) are both keyrings, and swapped they would still verify something."""
    try:
        mine: VerifiedPlan | None = verify_plan(name, plan_bytes, sig_bytes, own, now)
    except Rejected as exc:
        if exc.reason is Reason.DIGEST_MISMATCH:  # this key's own signature, over other bytes
            raise Rejected(
                Reason.DIGEST_MISMATCH, f"this key signed other bytes: {REWRITTEN}"
            ) from None
        mine = None
    if mine is not None:
        difference = _differences(mine.statement, expires_at, comment, provenance)
        if difference:
            raise Rejected(
                Reason.STATEMENT_MISMATCH,
                f"cannot keep the existing signature: {difference} (--replace signs anew)",
            )
        return "kept", sig_bytes
    if keyring is None:
        raise Rejected(
            Reason.UNTRUSTED_KEY,
            "no valid signature by this key: give the trusted keys to co-sign the sidecar, or "
            "--replace",
        )
    try:
        vouched = verify_plan(name, plan_bytes, sig_bytes, keyring.with_threshold(1), now)
    except Rejected as exc:
        if exc.reason is Reason.DIGEST_MISMATCH:
            raise Rejected(
                exc.reason, f"the trusted signature is for other bytes: {REWRITTEN}"
            ) from None
        raise Rejected(exc.reason, f"cannot co-sign: {exc.detail} (--replace signs anew)") from None
    difference = _differences(vouched.statement, expires_at, comment, provenance)
    if difference:
        raise Rejected(
            Reason.STATEMENT_MISMATCH, f"cannot co-sign: {difference} (--replace signs anew)"
        )
    return "co-signed", add_signature(name, plan_bytes, sig_bytes, signer)
