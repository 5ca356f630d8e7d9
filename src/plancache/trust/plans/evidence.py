"""Evidence signed with a plan (issue 49): how its number was measured, not only who signed it.

A signature says who vouched for a plan, not that its ``kv_cache_memory_bytes`` is right, and
vLLM's sizing has known errors in both directions (a cold compile records ~5 % less KV than a
warm one, vLLM #54383; CUDA graph memory counted twice, #57936; activations left out of the
profile, #56698). So the statement carries, beside the plan, what the measuring boot was: the
versions, its compile state and vLLM's own profiling numbers. Bytes in, checked, out; no IO.

What it proves: the signer's build node measured these numbers under these conditions and
vouched for them. What it cannot prove: that the number is right on another node (another
driver, co-tenants, a load peak the profile never saw); the free-memory gate, the unfinished-
boot note and the margin check at the end of start-up are what watch that on each node.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, TypeGuard

from .. import strictjson
from ..display import safe_text
from ..errors import Reason, Rejected

COMPILE_STATES = ("cold", "warm", "none")
"""How the measuring boot compiled: ``cold`` (it compiled, writing new artifacts), ``warm`` (it
only loaded compiled artifacts), ``none`` (it ran no compiled graph: eager, or compilation off)."""

EVIDENCE_KEYS: dict[str, tuple[type, ...]] = {
    "vllm_version": (str,),
    "torch_version": (str,),
    "compile": (str,),
    "weights_memory": (int,),
    "consumed_memory": (int,),
    "peak_activation_memory": (int,),
    "cudagraph_memory_estimate": (int,),
    "available_kv_cache_memory": (int,),
}
"""Evidence facts and their JSON types. The byte counts are vLLM's own, from the measuring
boot's worker: ``model_runner.model_memory_usage`` (weights), ``total_consumed`` (weights plus
non-torch memory), ``peak_activation_memory``, ``cudagraph_memory_estimate`` and
``available_kv_cache_memory_bytes``; vLLM exposes no other of its profiling numbers."""


def check_evidence(evidence: Mapping[str, Any], strict: bool = True) -> dict[str, Any]:
    """Known facts of the right type (``strict``: an unknown or ill-typed fact is rejected, as
    when signing; read back, a fact of a newer version, unknown or with a value this version does
    not know, is left out: the evidence decides nothing, so it never costs a plan).

    Raises:
        Rejected: with ``strict``, a fact of the wrong type, a byte count that is negative, a
            ``compile`` state not in :data:`COMPILE_STATES`, an unknown fact (``malformed``).
    """
    out: dict[str, Any] = {}
    for key, value in evidence.items():
        types = EVIDENCE_KEYS.get(key)
        if types is None:
            if strict:
                raise Rejected(
                    Reason.MALFORMED, f"statement: unknown evidence '{safe_text(key, 40)}'"
                )
            continue
        if value is None:
            continue
        if not strict:  # an account, deciding nothing: a fact this version cannot use is
            try:  # left out, never the plan's signature lost (a newer compile state, a float)
                out.update(check_evidence({key: value}))
            except Rejected:
                pass
            continue
        if isinstance(value, bool) or not isinstance(value, types):
            raise Rejected(Reason.MALFORMED, f"statement: evidence '{key}' has the wrong type")
        if isinstance(value, int) and value < 0:
            raise Rejected(Reason.MALFORMED, f"statement: evidence '{key}' is negative")
        if isinstance(value, str) and len(value) > 200:
            raise Rejected(Reason.MALFORMED, f"statement: evidence '{key}' is too long")
        if key == "compile" and value not in COMPILE_STATES:
            raise Rejected(
                Reason.MALFORMED, f"statement: evidence 'compile' is not one of {COMPILE_STATES}"
            )
        out[key] = value
    return out


def refuse_impossible(plan_bytes: bytes, device_total_memory: object = None) -> None:
    """Refuse to sign numbers that cannot be right, each with its own reason (the strict parser
    would call most of them ``malformed``; at signing the operator is told which number is wrong).

    Raises:
        Rejected: ``kv-not-positive`` (zero or negative KV: vLLM #57936's large graph pools),
            ``baseline-below-kv`` (the free memory measured with is less than the KV it hands
            out), ``kv-above-device-memory`` (KV or baseline above ``device_total_memory``, when
            the device's total is known).
    """
    try:
        obj = strictjson.loads(plan_bytes, "plan")
    except Rejected:
        return  # not JSON: the strict parser says so, with its own reason
    if not isinstance(obj, dict):
        return
    kv, baseline = obj.get("kv_cache_memory_bytes"), obj.get("free_memory_baseline")
    if not _count(kv):
        return
    if kv <= 0:
        raise Rejected(Reason.KV_NOT_POSITIVE, f"kv_cache_memory_bytes is {kv}: not signed")
    if _count(baseline) and baseline < kv:
        raise Rejected(
            Reason.BASELINE_BELOW_KV,
            f"free_memory_baseline {baseline} B is below kv_cache_memory_bytes {kv} B: not signed",
        )
    if _count(device_total_memory) and device_total_memory > 0:
        biggest = max(kv, baseline if _count(baseline) else 0)
        if biggest > device_total_memory:
            raise Rejected(
                Reason.KV_ABOVE_DEVICE,
                f"the plan's {biggest} B exceed the device's {device_total_memory} B: not signed",
            )


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def refuse_cold(evidence: Mapping[str, Any], allow_cold: bool) -> None:
    """Refuse a plan measured by a boot that compiled cold, unless ``allow_cold`` (the explicit
    override). vLLM records ~5 % less KV on a cold compile than on a warm one (vLLM #54383), and
    the first boot of a shape on a build node usually compiles cold.

    Raises:
        Rejected: the evidence says ``compile: cold`` (reason ``cold-compile``).
    """
    if evidence.get("compile") == "cold" and not allow_cold:
        raise Rejected(
            Reason.COLD_COMPILE,
            "the boot that measured it compiled cold (vLLM records less KV cache then); a second,"
            " warm boot records it again (PLANCACHE_SIGN_COLD=1 signs it anyway)",
        )


def evidence_note(evidence: Mapping[str, Any], plan_bytes: bytes) -> bytes:
    """The plugin's account of how it measured ``plan_bytes``, written beside the plan so that
    ``plancache sign`` (``plancache-ci-bake``) can sign it and refuse a cold one."""
    note = {"plan_sha256": hashlib.sha256(plan_bytes).hexdigest(), "evidence": dict(evidence)}
    return json.dumps(note, sort_keys=True).encode()


def evidence_for(note: bytes | None, plan_bytes: bytes) -> dict[str, Any]:
    """The evidence a note gives for exactly ``plan_bytes``; {} when there is none, it names
    other bytes (the plan was re-profiled or replaced since) or does not parse. Unsigned local
    data: the signer vouches for it with the plan, as for the plan's own bytes."""
    if note is None:
        return {}
    try:
        obj = strictjson.loads(note, "evidence note")
        if not isinstance(obj, dict) or not isinstance(obj.get("evidence"), dict):
            return {}
        if obj.get("plan_sha256") != hashlib.sha256(plan_bytes).hexdigest():
            return {}
        return check_evidence(obj["evidence"], strict=False)
    except Rejected:
        return {}
