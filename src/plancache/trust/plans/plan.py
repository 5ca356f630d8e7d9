"""vLLM's schema-1 startup plan: names, strict parsing, and writing the way vLLM writes it.

vLLM 0.33 trusts ``startup_plan_<fp>.json`` as it finds it; its own gate even accepts ``true``
as an integer, since ``isinstance(True, int)`` holds in Python. A plan decides how much GPU
memory the KV cache takes, so a wrong value means an OOM (too large) or a throughput collapse
(too small). The parser therefore accepts exactly vLLM's schema and nothing looser, while
keeping unknown extra fields (newer vLLM adds ``created_unix`` and friends) untouched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from .. import strictjson
from ..display import safe_text
from ..errors import Reason, Rejected

SCHEMA = 1
MAX_PLAN_BYTES = 64 * 1024
"""No honest plan comes near this; a cap stops a hostile file from costing memory or time."""

PLAN_PREFIX = "startup_plan_"
PLAN_SUFFIX = ".json"
SIG_SUFFIX = ".sig"
MAX_INT = 2**63 - 1
"""Byte counts end up in torch/C ints; anything larger is not a memory size."""
_KNOWN = frozenset({"schema", "fingerprint", "kv_cache_memory_bytes", "free_memory_baseline"})
"""The schema's fields: the rest of a plan is kept verbatim (:attr:`Plan.extra`)."""

_FINGERPRINT = re.compile(r"[0-9a-f]{16}")
_PLAN_NAME = re.compile(r"startup_plan_([0-9a-f]{16})\.json")
_SIG_NAME = re.compile(r"startup_plan_([0-9a-f]{16})\.json\.sig")


def is_fingerprint(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a plan fingerprint: 16 lowercase hex digits."""
    return isinstance(value, str) and _FINGERPRINT.fullmatch(value) is not None


def plan_name(fingerprint: str) -> str:
    """The file name vLLM uses for a plan (and plancache for its store objects).

    Raises:
        Rejected: ``fingerprint`` is not 16 lowercase hex digits (reason ``malformed``).
    """
    if not is_fingerprint(fingerprint):
        raise Rejected(Reason.MALFORMED, f"not a plan fingerprint: '{safe_text(fingerprint, 40)}'")
    return f"{PLAN_PREFIX}{fingerprint}{PLAN_SUFFIX}"


def sig_name(fingerprint: str) -> str:
    """The sidecar signature's name: the plan's name plus ``.sig`` (:func:`sidecar_of`)."""
    return sidecar_of(plan_name(fingerprint))


def sidecar_of(plan: str) -> str:
    """A plan's sidecar beside it: the plan's name, or its path, plus ``.sig``. The one rule
    :func:`sig_name` applies; a caller that holds the plan's path already (a local directory's
    read, on a 10,000-plan verify's hot path) derives the sidecar's from it, without a second
    fingerprint check or path join."""
    return plan + SIG_SUFFIX


def fingerprint_of_plan_name(name: str) -> str | None:
    """The fingerprint in an exact plan file name, else None (hostile listings are ignored)."""
    match = _PLAN_NAME.fullmatch(name)
    return match.group(1) if match else None


def fingerprint_of_sig_name(name: str) -> str | None:
    match = _SIG_NAME.fullmatch(name)
    return match.group(1) if match else None


@dataclass(frozen=True)
class Plan:
    """A parsed schema-1 plan. ``extra`` holds fields this version does not know, verbatim."""

    fingerprint: str
    kv_cache_memory_bytes: int
    free_memory_baseline: int
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return plan_name(self.fingerprint)


def _positive_int(obj: Mapping[str, Any], key: str) -> int:
    if key not in obj:
        raise Rejected(Reason.MALFORMED, f"plan lacks {key!r}")
    value = obj[key]
    # bool is a subclass of int: vLLM would take `true` as 1 byte. We do not.
    if type(value) is not int:
        raise Rejected(
            Reason.MALFORMED, f"plan field {key!r} must be an integer, got {type(value).__name__}"
        )
    if not 0 < value <= MAX_INT:
        raise Rejected(
            Reason.MALFORMED,
            f"plan field {key!r} must be between 1 and 2**63-1, got {safe_text(value, 40)}",
        )
    return value


def parse_plan(data: bytes, name: str) -> Plan:
    """Parse plan bytes found under file name ``name``, strictly.

    Raises:
        Rejected: ``too-large`` (over :data:`MAX_PLAN_BYTES`), ``malformed`` (not a plan file
            name, not JSON, another schema, a field missing or not an integer in range, a KV
            cache larger than the baseline), ``fingerprint-mismatch`` (the plan names another
            fingerprint than its file name).
    """
    if len(data) > MAX_PLAN_BYTES:
        raise Rejected(Reason.TOO_LARGE, f"plan is {len(data)} bytes, the cap is {MAX_PLAN_BYTES}")
    name_fp = fingerprint_of_plan_name(name)
    if name_fp is None:
        raise Rejected(
            Reason.MALFORMED,
            f"'{safe_text(name, 80)}' is not a plan file name (startup_plan_<16 hex>.json)",
        )
    obj = strictjson.loads(data, "plan")
    if not isinstance(obj, dict):
        raise Rejected(Reason.MALFORMED, "plan is not a JSON object")
    schema = obj.get("schema")
    if type(schema) is not int or schema != SCHEMA:
        raise Rejected(
            Reason.MALFORMED, f"plan schema must be {SCHEMA}, got {safe_text(schema, 40)}"
        )
    fingerprint = obj.get("fingerprint")
    if fingerprint != name_fp and not is_fingerprint(fingerprint):  # the name's fp is one
        raise Rejected(Reason.MALFORMED, "plan fingerprint is not 16 lowercase hex digits")
    if fingerprint != name_fp:
        raise Rejected(
            Reason.FINGERPRINT_MISMATCH,
            f"plan says fingerprint {fingerprint} but is named for {name_fp}",
        )
    kv = _positive_int(obj, "kv_cache_memory_bytes")
    baseline = _positive_int(obj, "free_memory_baseline")
    if kv > baseline:
        raise Rejected(
            Reason.MALFORMED, f"kv_cache_memory_bytes {kv} exceeds free_memory_baseline {baseline}"
        )
    # the four fields are there (each read above): any other key is an extra
    extra = {k: v for k, v in obj.items() if k not in _KNOWN} if len(obj) > len(_KNOWN) else {}
    return Plan(fingerprint, kv, baseline, extra)


def render_plan(plan: Plan) -> bytes:
    """Serialise a plan the way vLLM 0.33's ``maybe_save_startup_plan`` does."""
    obj: dict[str, Any] = {
        "schema": SCHEMA,
        "fingerprint": plan.fingerprint,
        "kv_cache_memory_bytes": plan.kv_cache_memory_bytes,
        "free_memory_baseline": plan.free_memory_baseline,
    }
    obj.update(plan.extra)
    return json.dumps(obj).encode("utf-8")
