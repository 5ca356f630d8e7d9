"""Plan sets: every rank's plan and sidecar in one store object, signed as one.

Why: in a boot storm each rank fetching its own plan and sidecar is 2 GETs per rank, 16 per
8-GPU node, all on a few hot objects. Every rank can compute every rank's fingerprint (vLLM's
``compute_plan_fingerprint(config, rank, world_size)``: same configuration, only the rank
differs), hence the set's name, so one GET per node serves all of them.

The object ``startup_planset_<id>.set``::

    <DSSE envelope, canonical, one line ending in "\\n"><body>
    body = plan_0 sig_0 plan_1 sig_1 ...       (each member's plan bytes, then its sidecar's)

``<id>`` is :func:`.plan_set_names.set_id` of the member fingerprints in rank order. The
envelope's statement (predicate :data:`SET_PREDICATE`) names the object as its one subject with
the sha256 of the whole body, and lists the members (fingerprint, plan length, sidecar length)
in order. So:

* the signature covers every byte of every member (one digest over the body) and their
  order: members of two bakes can never be combined into a set that verifies;
* the name binds the member list: a set whose listed fingerprints do not hash to its name is
  refused, so a rank never reads a set made for another world;
* nothing of the body is parsed before the envelope verified and the body's digest matched;
  then each member is verified on its own (:func:`~..verify.verify_plan`: its own sidecar,
  signers, windows, and the plan's fingerprint against its name), so a set adds a binding,
  never a way around a plan's own checks, and the sidecars written locally verify as today's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from .. import envelope as dsse
from ..display import safe_text
from ..errors import ConfigError, Reason, Rejected
from ..keyring.identities import IdentitySigner
from ..keyring.keys import Keyring, Signer
from ..keyring.signatories import DEFAULT_CLOCK_SKEW
from ..sealing import claimed_payload, seal
from ..signing import MAX_SIGNED_BYTES
from ..statement import format_time, parse_time, render_statement, statement_shell
from ..verify import SignedKind, VerifiedPlan, open_signed, verify_plan
from .plan import MAX_PLAN_BYTES, is_fingerprint, plan_name
from .plan_set_names import MAX_MEMBERS, members_of, set_id, set_id_of_name, set_name

SET_PREDICATE = "https://plancache.dev/startup-plan-set/v1"
MAX_SET_BYTES = 4 * 1024 * 1024
"""Cap on a set object. Plans are ~200 bytes and a key's sidecar ~600, but a keyless signature
adds its verification material (:data:`~..envelope.KEYLESS_ALLOWANCE`): ~10 KB on the
public-good instance, whose GitHub certificates are large and appear twice (the certificate and
the log entry). A sidecar co-signed by a key and two identities over a statement at the signing
cap is ~26 KB, so 64 such members and a keyless head are ~1.7 MiB: over the former 1 MiB. 4 MiB
holds them with room, and still bounds what one GET makes a node hold."""


@dataclass(frozen=True)
class Member:
    fingerprint: str
    plan_size: int
    sig_size: int


@dataclass(frozen=True)
class SetStatement:
    subject_name: str
    subject_sha256: str
    set_id: str
    members: tuple[Member, ...]
    signed_at: datetime
    expires_at: datetime | None = None
    comment: str = ""

    def to_json_bytes(self) -> bytes:
        predicate = {
            "set": self.set_id,
            "members": [
                {"fingerprint": m.fingerprint, "plan": m.plan_size, "sig": m.sig_size}
                for m in self.members
            ],
            "signed_at": format_time(self.signed_at),
            "expires_at": format_time(self.expires_at) if self.expires_at else None,
            "comment": self.comment,
        }
        return render_statement(
            self.subject_name,
            sha256=self.subject_sha256,
            predicate_type=SET_PREDICATE,
            predicate=predicate,
        )


@dataclass(frozen=True)
class VerifiedSet:
    """A set whose envelope, body and every member verified. Only :func:`verify_set` makes one."""

    name: str
    statement: SetStatement
    plans: tuple[VerifiedPlan, ...]
    signers: tuple[str, ...]
    key_ids: tuple[str, ...] = ()
    """Key ids of the set's signers, in the order of ``signers`` (as :class:`VerifiedPlan`)."""
    identities: tuple[IdentitySigner, ...] = ()
    """Keyless signers of the set (identity, issuer, log index), among ``signers``."""


def _size(value: object, cap: int) -> int:
    if type(value) is not int or not 0 < value <= cap:
        raise Rejected(
            Reason.MALFORMED, "plan set: a member's size is not a positive integer within its cap"
        )
    return value


def parse_set_statement(payload: bytes) -> SetStatement:
    """Parse a (signature-verified) set statement, strictly.

    Raises:
        Rejected: any deviation from the set statement's schema (reason ``malformed``).
    """
    name, sha256, predicate = statement_shell(
        payload, "plan set statement", predicate_type=SET_PREDICATE
    )
    raw = predicate.get("members")
    if (
        not isinstance(raw, list)
        or not 1 <= len(raw) <= MAX_MEMBERS
        or not all(isinstance(m, dict) for m in raw)
    ):
        raise Rejected(Reason.MALFORMED, f"plan set statement needs 1 to {MAX_MEMBERS} members")
    members = []
    for m in raw:
        if not is_fingerprint(m.get("fingerprint")):
            raise Rejected(
                Reason.MALFORMED, "plan set: a member's fingerprint is not 16 lowercase hex digits"
            )
        members.append(
            Member(
                m["fingerprint"],
                _size(m.get("plan"), MAX_PLAN_BYTES),
                _size(m.get("sig"), dsse.MAX_SIG_OBJECT_BYTES),
            )
        )
    ident, comment, expires = (
        predicate.get("set"),
        predicate.get("comment", ""),
        predicate.get("expires_at"),
    )
    if not is_fingerprint(ident) or not isinstance(comment, str):
        raise Rejected(Reason.MALFORMED, "plan set statement: set id or comment has the wrong type")
    return SetStatement(
        name,
        sha256,
        ident,
        tuple(members),
        parse_time(predicate.get("signed_at"), "signed_at"),
        None if expires is None else parse_time(expires, "expires_at"),
        comment,
    )


SET_SIGNATURE = SignedKind(parse_set_statement, lambda s: s.subject_name, "signature is")
"""A set's head: the statement names the set object and the sha256 of its body."""


def split_set(data: bytes) -> tuple[bytes, bytes]:
    """(envelope line, body) of a set object, before anything of either is parsed.

    Raises:
        Rejected: no line end within a signature object's cap (reason ``malformed``).
    """
    end = data.find(b"\n", 0, dsse.MAX_SIG_OBJECT_BYTES + 1)
    if end < 0:
        raise Rejected(Reason.MALFORMED, "plan set: no signature envelope line at its start")
    return data[: end + 1], data[end + 1 :]


def claimed_members(data: bytes) -> list[str]:
    """The fingerprints a set object *claims* to hold, unverified: for ``ls`` without keys and
    for ``prune``, which deletes sets whose members it deletes (deleting needs no trust). Never
    a reason to use anything in the set.

    Raises:
        Rejected: the object is over :data:`MAX_SET_BYTES` or its envelope over its cap
            (reason ``too-large``), or its envelope or statement is off their schema
            (``malformed``).
    """
    if len(data) > MAX_SET_BYTES:
        raise Rejected(
            Reason.TOO_LARGE, f"plan set is {len(data)} bytes, the cap is {MAX_SET_BYTES}"
        )
    head, _ = split_set(data)
    return [m.fingerprint for m in parse_set_statement(claimed_payload(head)).members]


def verify_set(
    name: str,
    data: bytes,
    keyring: Keyring,
    now: datetime,
    *,
    clock_skew: timedelta = DEFAULT_CLOCK_SKEW,
) -> VerifiedSet:
    """A set object's bytes in, every member verified out, or a typed error with a reason.

    Order: size cap; the name; the envelope (canonical) and its signatures by trusted keys; the
    statement; subject name and the body's sha256; the member list against the name's id and
    the body's length; the signers' windows and threshold; then each member, sliced by the
    signed lengths, through :func:`verify_plan` (the first failure rejects the whole set).

    Raises:
        Rejected: in that order, ``too-large`` (over :data:`MAX_SET_BYTES`), ``malformed`` (not
            a set name, no canonical envelope, a statement off its schema, sizes that do not
            add up to the body), ``revoked``, ``bad-signature`` or ``untrusted-key`` (no trusted
            key signed), ``name-mismatch``, ``digest-mismatch`` (the body is not the signed
            one), ``fingerprint-mismatch`` (the member list is another set's), ``expired``,
            ``threshold-not-met``, ``not-yet-valid``; then the first member's failure, with
            :func:`~..verify.verify_plan`'s reason.
    """
    if len(data) > MAX_SET_BYTES:
        raise Rejected(
            Reason.TOO_LARGE, f"plan set is {len(data)} bytes, the cap is {MAX_SET_BYTES}"
        )
    ident = set_id_of_name(name)
    if ident is None:
        raise Rejected(
            Reason.MALFORMED,
            f"'{safe_text(name, 80)}' is not a plan set name (startup_planset_<16 hex>.set)",
        )
    head, body = split_set(data)

    def binds_body(statement: SetStatement) -> None:
        if statement.subject_sha256 != hashlib.sha256(body).hexdigest():
            raise Rejected(
                Reason.DIGEST_MISMATCH,
                "plan set bytes do not match the signed sha256 (altered or mixed set?)",
            )
        fps = [m.fingerprint for m in statement.members]
        if statement.set_id != ident or members_of(fps) != fps or set_id(fps) != ident:
            raise Rejected(
                Reason.FINGERPRINT_MISMATCH,
                f"plan set {ident}: its signed member list is for another set",
            )
        if sum(m.plan_size + m.sig_size for m in statement.members) != len(body):
            raise Rejected(
                Reason.MALFORMED, "plan set: the members' signed sizes do not add up to its body"
            )

    opened = open_signed(
        head, keyring, SET_SIGNATURE, name, now=now, clock_skew=clock_skew, check=binds_body
    )
    statement = opened.statement
    plans, offset = [], 0
    for m in statement.members:
        plan_bytes = body[offset : offset + m.plan_size]
        sig_bytes = body[offset + m.plan_size : offset + m.plan_size + m.sig_size]
        offset += m.plan_size + m.sig_size
        plans.append(
            verify_plan(plan_name(m.fingerprint), plan_bytes, sig_bytes, keyring, now, clock_skew)
        )
    return VerifiedSet(
        name, statement, tuple(plans), opened.names, opened.key_ids, opened.identities
    )


def build_set(
    members: Sequence[tuple[str, bytes, bytes]],
    signer: Signer,
    now: datetime,
    *,
    expires_at: datetime | None = None,
    comment: str = "",
) -> tuple[str, bytes]:
    """(name, bytes) of a set over ``(fingerprint, plan bytes, sidecar bytes)`` in rank order,
    signed by ``signer``. The caller hands verified members (push verifies them first).

    Raises:
        Rejected: not 1 to :data:`MAX_MEMBERS` valid fingerprints (reason ``malformed``).
        ConfigError: a fingerprint listed twice, a statement over the signing cap, a time
            outside the calendar, or a remote key that refuses to sign (reason
            ``config-error``).
        StoreTimeout: a remote key did not answer within its budget (reason ``timeout``).
    """
    fps = [fp for fp, _, _ in members]
    if members_of(fps) != fps:
        raise ConfigError("a plan set needs 1 to 64 distinct fingerprints")
    name = set_name(fps)
    body = b"".join(plan + sig for _, plan, sig in members)
    statement = SetStatement(
        name,
        hashlib.sha256(body).hexdigest(),
        set_id(fps),
        tuple(Member(fp, len(p), len(s)) for fp, p, s in members),
        now,
        expires_at,
        comment,
    )
    payload = statement.to_json_bytes()
    data = dsse.pae(dsse.PAYLOAD_TYPE, payload)
    if len(data) > MAX_SIGNED_BYTES:
        raise ConfigError(
            f"the plan set's statement is {len(payload)} bytes, over the {MAX_SIGNED_BYTES}-byte "
            "signing cap"
        )
    head = seal(payload, signer)
    return name, head + body
