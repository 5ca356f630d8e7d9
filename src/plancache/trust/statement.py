"""The in-toto Statement v1 that a plan's signature carries.

The subject binds the signature to one file: the plan's name and the sha256 of its exact
bytes. The predicate says which fingerprint it is for, when it was signed and until when it
holds, plus provenance: facts about the profiling boot. Some of those facts are *conditions*
(see :data:`CONDITION_KEYS`): vLLM's fingerprint does not cover them, yet the plan's numbers
depend on them, so the gate compares them with the booting worker.

Two optional predicate fields (issue 20), written only when known, so a statement made
without them is byte-for-byte what older versions wrote and older versions, which ignore
predicate keys they do not know, still read new ones:

- ``inputs``: the fingerprint's inputs in the clear (what vLLM's ``compute_plan_fingerprint``
  hashed, :mod:`.inputs`), so a node that misses can be told which input differs;
- ``config_parts``: the hash of each part of vLLM's configuration (``model_config``,
  ``cache_config``, ...: what ``VllmConfig.compute_hash`` combines into the ``vllm_config``
  input), so a differing ``vllm_config`` can be narrowed to the part that differs;
- ``measurements``: what the profiling boot measured (``profile_ms``: vLLM's memory profiling),
  so a boot that applies the plan can say how much time it saved.

A fifth, ``evidence`` (issue 49; kept apart from ``provenance``, which the gate compares and
other work may redact): *how* the plan's number was measured, from the boot that wrote it:
vLLM's and torch's versions, whether that boot compiled cold, loaded a warm compile cache or
ran without compiling (:mod:`.plans.evidence`), and vLLM's own profiling numbers where it
exposes them. It is what the build node measured, signed: it proves who
vouched for which measurement, never that the number holds on another node. Plans signed
without it stay valid; they show "evidence: none".
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from . import strictjson
from .display import redact, safe_text
from .errors import ConfigError, Reason, Rejected
from .inputs import check_inputs
from .plans.evidence import check_evidence
from .plans.plan import is_fingerprint

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://plancache.dev/startup-plan/v1"

PROVENANCE_KEYS: dict[str, tuple[type, ...]] = {
    "model": (str,),
    "vllm_version": (str,),
    "torch_version": (str,),
    "device_name": (str,),
    "device_total_memory": (int,),
    "rank": (int,),
    "world_size": (int,),
    "gpu_memory_utilization": (float, int),
}
"""Known provenance facts and their JSON types; unknown keys are rejected at signing time."""

CONDITION_KEYS = ("gpu_memory_utilization", "device_name", "device_total_memory")
"""Provenance facts the gate enforces: the plan only holds when the booting worker matches."""

_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def format_time(moment: datetime) -> str:
    """RFC 3339 UTC with second precision: the only time format statements carry.

    Written by hand, not with ``strftime``: glibc prints year 1 as ``1``, not ``0001``, and a
    statement must always parse back. Converting a time near year 1 or 9999 from another
    zone can leave the calendar: that is the caller's bad input.

    Raises:
        ConfigError: the moment, in UTC, lies outside the years 1 to 9999 (reason
            ``config-error``).
    """
    utc = moment
    if moment.tzinfo is not timezone.utc:  # what every parsed time has: nothing to convert
        try:
            if moment.utcoffset() != timedelta(0):
                utc = moment.astimezone(timezone.utc)
        except OverflowError:
            raise ConfigError(
                f"time {safe_text(moment, 40)} is outside the years 1 to 9999 in UTC"
            ) from None
    # %-formatting: half the cost of the same f-string's format specs (every report prints one)
    return "%04d-%02d-%02dT%02d:%02d:%02dZ" % (  # noqa: UP031 - the faster of the two, above
        utc.year,
        utc.month,
        utc.day,
        utc.hour,
        utc.minute,
        utc.second,
    )


def parse_time(value: object, what: str) -> datetime:
    """A statement's time (:func:`format_time`'s form, exactly), ``what`` naming it in errors.

    Raises:
        Rejected: not that form, or no valid date (reason ``malformed``).
    """
    if not isinstance(value, str) or not _TIME.fullmatch(value):
        raise Rejected(
            Reason.MALFORMED, f"statement: {what} is not a UTC time like 2026-01-31T12:00:00Z"
        )
    # the pattern fixed the form, which fromisoformat reads as UTC (~5x cheaper than by hand);
    # with "+00:00" for its "Z", which Python 3.10's (requires-python) does not read
    try:
        return datetime.fromisoformat(value[:-1] + "+00:00")
    except ValueError:
        raise Rejected(Reason.MALFORMED, f"statement: {what} is not a valid date") from None


@dataclass(frozen=True)
class Statement:
    subject_name: str
    subject_sha256: str
    fingerprint: str
    signed_at: datetime
    expires_at: datetime | None = None
    comment: str = ""
    provenance: Mapping[str, Any] = field(default_factory=dict)
    inputs: Mapping[str, Any] = field(default_factory=dict)
    """The fingerprint's inputs, in the clear (empty: not recorded, as before issue 20)."""
    config_parts: Mapping[str, Any] = field(default_factory=dict)
    """Part of vLLM's configuration -> its ``compute_hash()`` (empty: not recorded)."""
    measurements: Mapping[str, Any] = field(default_factory=dict)
    """``profile_ms``: how long the profiling boot's memory profiling took (empty: not measured)."""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    """How the plan was measured (:data:`EVIDENCE_KEYS`; empty: signed without evidence)."""

    def to_json_bytes(self) -> bytes:
        predicate: dict[str, Any] = {
            "fingerprint": self.fingerprint,
            "signed_at": format_time(self.signed_at),
            "expires_at": format_time(self.expires_at) if self.expires_at else None,
            "comment": self.comment,
            "provenance": dict(self.provenance),
        }
        if self.inputs:
            predicate["inputs"] = dict(self.inputs)
        if self.config_parts:
            predicate["config_parts"] = dict(self.config_parts)
        if self.measurements:
            predicate["measurements"] = dict(self.measurements)
        if self.evidence:
            predicate["evidence"] = dict(self.evidence)
        return render_statement(
            self.subject_name,
            sha256=self.subject_sha256,
            predicate_type=PREDICATE_TYPE,
            predicate=predicate,
        )


def render_statement(
    name: str, *, sha256: str, predicate_type: str, predicate: Mapping[str, Any]
) -> bytes:
    """An in-toto Statement v1 with one subject, in the one canonical form every kind signs
    (plans, plan sets, compile-cache manifests, their headers): sorted keys, no spaces. All
    but the subject's name are named: three strings side by side would swap silently."""
    obj = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": sha256}}],
        "predicateType": predicate_type,
        "predicate": dict(predicate),
    }
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")


_SHELL_KEYS = {"_type", "subject", "predicateType", "predicate"}


def statement_shell(
    payload: bytes, what: str, *, predicate_type: str, exact: bool = True
) -> tuple[str, str, dict[str, Any]]:
    """(subject name, subject sha256, predicate) of a (signature-verified) statement of
    ``predicate_type`` with exactly one subject. ``exact`` also refuses keys beyond the in-toto
    ones, at the top and in the subject; plan statements are read with ``exact=False``, as they
    always were (signed plans in the field).

    Raises:
        Rejected: not JSON, not an in-toto Statement v1 of ``predicate_type``, not exactly one
            subject with a name and a sha256 digest, or no predicate object (reason
            ``malformed``).
    """
    obj = strictjson.loads(payload, what)
    if not isinstance(obj, dict) or (exact and set(obj) != _SHELL_KEYS):
        raise Rejected(
            Reason.MALFORMED, f"{what} must have exactly _type, subject, predicateType, predicate"
        )
    if obj.get("_type") != STATEMENT_TYPE or obj.get("predicateType") != predicate_type:
        raise Rejected(
            Reason.MALFORMED,
            f"{what} is not an in-toto Statement v1 of predicateType {predicate_type}",
        )
    subjects = obj.get("subject")
    only = subjects[0] if isinstance(subjects, list) and len(subjects) == 1 else None
    subject: dict[str, Any] = only if isinstance(only, dict) else {}  # {}: no name, refused
    held = subject.get("digest")
    digest: dict[str, Any] = held if isinstance(held, dict) else {}  # {}: no sha256, refused
    name, sha256 = subject.get("name"), digest.get("sha256")
    if (
        not isinstance(name, str)
        or not isinstance(sha256, str)
        or not _SHA256.fullmatch(sha256)
        or (exact and (set(subject) != {"name", "digest"} or set(digest) != {"sha256"}))
    ):
        raise Rejected(
            Reason.MALFORMED,
            f"{what} must have exactly one subject with a name and a sha256 digest",
        )
    predicate = obj.get("predicate")
    if not isinstance(predicate, dict):
        raise Rejected(Reason.MALFORMED, f"{what} has no predicate object")
    return name, sha256, predicate


def check_provenance(provenance: Mapping[str, Any]) -> dict[str, Any]:
    """Validate provenance facts against :data:`PROVENANCE_KEYS` (bools are not numbers).

    Raises:
        Rejected: an unknown fact, a value of the wrong type, a number not finite and
            non-negative, a ``gpu_memory_utilization`` outside (0, 1] (reason ``malformed``).
    """
    out: dict[str, Any] = {}
    for key, value in provenance.items():
        types = PROVENANCE_KEYS.get(key)
        if types is None:
            raise Rejected(
                Reason.MALFORMED, f"statement: unknown provenance fact '{safe_text(key, 40)}'"
            )
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, types):
            raise Rejected(Reason.MALFORMED, f"statement: provenance '{key}' has the wrong type")
        if isinstance(value, (int, float)):  # the only facts that can fail the two checks
            if not 0 <= value < math.inf:
                raise Rejected(
                    Reason.MALFORMED,
                    f"statement: provenance '{key}' is not a finite, non-negative number",
                )
            if key == "gpu_memory_utilization" and not 0 < value <= 1:
                raise Rejected(
                    Reason.MALFORMED,
                    "statement: provenance 'gpu_memory_utilization' is not in (0, 1]",
                )
        out[key] = value
    return out


_USER_HOME = re.compile(r"(?<![A-Za-z0-9_.-])(/(?:home|Users)/)[^/\s'\"]+")
"""A user's home in a path (``/home/alice/models/x``): the build node's user name."""


def signable_provenance(provenance: Mapping[str, Any]) -> dict[str, Any]:
    """Facts as a new statement signs them: checked (:func:`check_provenance`), each text
    redacted as output is (:func:`~.display.redact`: a model given as
    ``https://user:token@host/…`` or with a ``?token=`` signs as ``https://***@host/…``), and a
    user's name in a home path masked (``/home/alice/models/x`` signs as
    ``/home/***/models/x``; no gate compares the model). A statement goes to a shared bucket and
    is printed by every ``inspect``: a credential in it would outlive the credential's rotation,
    signed, and a build node's user names are not the store's to hold.

    Raises:
        Rejected: as :func:`check_provenance`.
    """
    return {
        key: _USER_HOME.sub(r"\1***", redact(value)) if isinstance(value, str) else value
        for key, value in check_provenance(provenance).items()
    }


MEASUREMENT_KEYS = ("profile_ms",)
"""Known measurements (milliseconds, finite, non-negative); others are rejected at signing time
and ignored when read (a newer version may measure more)."""


def check_measurements(measurements: Mapping[str, Any], strict: bool = True) -> dict[str, Any]:
    """Finite, non-negative numbers under known names (``strict``: an unknown name is rejected).

    Raises:
        Rejected: a value not a finite, non-negative number; with ``strict``, a name not in
            :data:`MEASUREMENT_KEYS` (reason ``malformed``).
    """
    out: dict[str, Any] = {}
    for key, value in measurements.items():
        if key not in MEASUREMENT_KEYS:
            if strict:
                raise Rejected(
                    Reason.MALFORMED, f"statement: unknown measurement '{safe_text(key, 40)}'"
                )
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not 0 <= value < math.inf
        ):
            raise Rejected(
                Reason.MALFORMED,
                f"statement: measurement '{key}' is not a finite, non-negative number",
            )
        out[key] = value
    return out


def parse_statement(payload: bytes) -> Statement:
    """Parse a (signature-verified) payload, strictly.

    Raises:
        Rejected: any deviation from the statement's schema (reason ``malformed``); inputs or
            configuration parts beyond their caps (``too-large``, :func:`.inputs.check_inputs`).
    """
    name, sha256, predicate = statement_shell(
        payload, "statement", predicate_type=PREDICATE_TYPE, exact=False
    )
    fingerprint = predicate.get("fingerprint")
    if not is_fingerprint(fingerprint):
        raise Rejected(Reason.MALFORMED, "statement fingerprint is not 16 lowercase hex digits")
    expires = predicate.get("expires_at")
    comment = predicate.get("comment", "")
    provenance = predicate.get("provenance", {})
    if not isinstance(comment, str) or not isinstance(provenance, dict):
        raise Rejected(Reason.MALFORMED, "statement comment or provenance has the wrong type")
    measurements = predicate.get("measurements", {})
    if not isinstance(measurements, dict):
        raise Rejected(Reason.MALFORMED, "statement measurements is not an object")
    evidence = predicate.get("evidence", {})
    if not isinstance(evidence, dict):
        raise Rejected(Reason.MALFORMED, "statement evidence is not an object")
    return Statement(
        subject_name=name,
        subject_sha256=sha256,
        fingerprint=fingerprint,
        signed_at=parse_time(predicate.get("signed_at"), "signed_at"),
        expires_at=None if expires is None else parse_time(expires, "expires_at"),
        comment=comment,
        provenance=check_provenance(provenance),
        inputs=check_inputs(predicate.get("inputs", {}), "statement inputs"),
        config_parts=check_inputs(predicate.get("config_parts", {}), "statement config_parts"),
        measurements=check_measurements(measurements, strict=False),
        evidence=check_evidence(evidence, strict=False),
    )
