"""Why a node would miss: this node's keys and inputs against what a store or directory holds,
verified.

``plancache explain`` asks, for every rank of a configuration, whether a worker would use a plan
and a compile cache, and if not which stored candidates come nearest and exactly which inputs
differ. The comparison is only as good as its evidence, so only *verified* statements and
manifests are compared (a plan's signed fingerprint inputs, a cache's signed key factors); an
unsigned or invalid candidate is counted and named as not compared, never read as a claim.

The node's side (its fingerprints, their inputs, vLLM's compile factors here) comes from the
caller (the CLI builds it with vLLM, as ``plancache fingerprint`` does); this module moves the
store's bytes through the shared audit and the compile-cache signature reads, then compares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..clock import Deadline
from ..storage.compile_cache import archives
from ..storage.store import Store
from ..trust.compile_cache.manifest import Manifest
from ..trust.compile_cache.manifest_signature import MAX_SIG_OBJECT_BYTES, verify_manifest
from ..trust.display import safe_text
from ..trust.errors import PlanCacheError
from ..trust.inputs import SALT_KEY, differences
from ..trust.keyring.keys import Keyring
from ..trust.statement import CONDITION_KEYS
from .audit import VALID, PlanReport
from .compile_cache.local_caches import CacheRoot, read_sidecar
from .keyless_report import signed_by, signers_of

NEAREST = 3
MAX_CACHES = 500
"""Compile-cache signatures read at most from one location (each is one capped GET)."""


@dataclass(frozen=True)
class NodeRank:
    """This node's side for one rank: vLLM's fingerprint, its inputs, the gate's conditions."""

    rank: int
    fingerprint: str
    inputs: Mapping[str, Any]
    conditions: Mapping[str, Any] = field(default_factory=dict)
    config_parts: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CacheCandidate:
    """One stored compile cache: its verified manifest, or why it did not verify."""

    subject: str
    manifest: Manifest | None
    signers: tuple[str, ...] = ()
    reason: str = ""
    detail: str = ""
    signed_by: tuple[dict[str, Any], ...] = ()
    """Who signed the verified manifest (:func:`.keyless_report.signers_of`)."""


def _condition_differences(
    provenance: Mapping[str, Any] | None, here: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The gate's conditions the signed plan records and this node differs in (both known)."""
    signed = {k: v for k, v in (provenance or {}).items() if k in CONDITION_KEYS}
    return [
        {"input": k, "signed": signed[k], "here": here[k]}
        for k in sorted(signed)
        if k in here and here[k] is not None and signed[k] != here[k]
    ]


def _input_differences(report: PlanReport, rank: NodeRank) -> list[dict[str, Any]]:
    """The inputs that differ; a differing ``vllm_config`` is followed by the configuration parts
    that differ (``vllm_config.cache_config``), when both sides recorded them."""
    found = differences(report.inputs or {}, rank.inputs)
    if (
        report.config_parts
        and rank.config_parts
        and any(d["input"] == "vllm_config" for d in found)
    ):
        found += differences(
            {"vllm_config": report.config_parts}, {"vllm_config": rank.config_parts}
        )
    return found


def _plan_candidates(
    rank: NodeRank, reports: Sequence[PlanReport], nearest: int
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for report in reports:
        if report.status != VALID or not report.inputs or report.fingerprint == rank.fingerprint:
            continue
        rows.append(
            {
                "fingerprint": report.fingerprint,
                "differs": _input_differences(report, rank),
                "signers": list(report.signers),
                "signed_by": signed_by(report.signers, report.signer_ids, report.keyless),
                "signed_at": report.signed_at,
            }
        )
    rows.sort(
        key=lambda r: (
            sum("." not in d["input"] for d in r["differs"]),
            len(r["differs"]),
            r["fingerprint"],
        )
    )
    return rows[:nearest]


def _names(who: Sequence[Mapping[str, Any]]) -> str:
    """Who signed, for a detail line: a keyless signer by its identity (the certificate's SAN,
    what a trusted-keys line's ``name=`` may hide), a key by its name; one escaped line each."""
    return ", ".join(safe_text(s.get("identity") or s["name"], 200) for s in who) or "?"


def explain_plan(
    rank: NodeRank, reports: Sequence[PlanReport], nearest: int = NEAREST
) -> dict[str, Any]:
    """Would this rank's worker apply a plan from ``reports``; if not, the nearest verified
    ones."""
    hit = next((r for r in reports if r.fingerprint == rank.fingerprint), None)
    not_compared = {
        "unverified": sum(r.status != VALID for r in reports if r.fingerprint != rank.fingerprint),
        "without_inputs": sum(r.status == VALID and not r.inputs for r in reports),
    }
    out: dict[str, Any] = {
        "fingerprint": rank.fingerprint,
        "candidates": [],
        "not_compared": not_compared,
    }
    if hit is not None and hit.status == VALID:
        who = signed_by(hit.signers, hit.signer_ids, hit.keyless)
        # how it was measured (issue 49): what the build node signed, "none" for older plans
        out.update(signers=list(hit.signers), signed_by=who, evidence=hit.evidence)
        conditions = _condition_differences(hit.provenance, rank.conditions)
        if conditions:
            out.update(
                decision="profile",
                reason="condition-mismatch",
                differs=conditions,
                detail=f"the plan verifies (signed by {_names(who)}), but the gate's signed "
                "conditions differ from this node's",
            )
        else:
            out.update(
                decision="apply",
                reason="applied",
                differs=[],
                detail=f"verified, signed by {_names(who)}; applies with at least "
                f"{hit.free_memory_baseline} B free",
            )
        return out
    if hit is not None:
        out.update(
            decision="profile",
            reason=hit.reason,
            differs=[],
            detail=f"the plan does not verify: {hit.detail}",
        )
    else:
        out.update(
            decision="profile",
            reason="no-plan",
            differs=[],
            detail="no plan under this fingerprint",
        )
    out["candidates"] = _plan_candidates(rank, reports, nearest)
    return out


def caches_in_store(
    store: Store, keyring: Keyring, now: datetime, deadline: Deadline
) -> list[CacheCandidate]:
    """Every compile cache the store lists (at most :data:`MAX_CACHES`), its signature
    verified."""
    found = []
    for subject in archives.list_subjects(store, deadline)[:MAX_CACHES]:
        try:
            sig = archives.get_object(
                store, archives.sig_name(subject), MAX_SIG_OBJECT_BYTES, deadline=deadline
            )
            found.append(_verified(subject, sig, keyring, now))
        except PlanCacheError as exc:
            found.append(CacheCandidate(subject, None, (), exc.reason.value, exc.detail))
    return found


def caches_in_root(root: CacheRoot, keyring: Keyring, now: datetime) -> list[CacheCandidate]:
    """Every compile cache under a local cache root, its signature verified (files are the
    guard's)."""
    found = []
    for subject in root.subjects()[:MAX_CACHES]:
        try:
            found.append(_verified(subject, read_sidecar(root.directory(subject)), keyring, now))
        except PlanCacheError as exc:
            found.append(CacheCandidate(subject, None, (), exc.reason.value, exc.detail))
    return found


def _verified(subject: str, sig: bytes | None, keyring: Keyring, now: datetime) -> CacheCandidate:
    verified = verify_manifest(subject, sig, keyring, now)
    return CacheCandidate(
        subject, verified.manifest, verified.signers, signed_by=tuple(signers_of(verified))
    )


def _has_rank(manifest: Manifest, rank: int) -> bool:
    return any(d.split("/")[0].startswith(f"rank_{rank}_") for d in manifest.dirs)


def explain_compile(
    rank: int,
    here: Mapping[str, Any],
    caches: Sequence[CacheCandidate],
    *,
    nearest: int = NEAREST,
) -> dict[str, Any]:
    """Would this rank load a stored compile cache: one whose signed key factors equal this
    node's in every factor known here before a compile (``here``: ``env``, ``config_hash``;
    vLLM compares the traced code's hash itself at load) and that holds this rank's artifacts."""
    not_compared = {
        "unverified": sum(c.manifest is None for c in caches),
        "without_factors": sum(
            c.manifest is not None and c.manifest.key_factors is None for c in caches
        ),
    }
    rows: list[dict[str, Any]] = []
    for cache in caches:
        manifest = cache.manifest
        if manifest is None or manifest.key_factors is None:
            continue  # not compared: counted above
        signed = {  # keyed values compare under their salt
            k: v for k, v in manifest.key_factors.items() if k in here or k == SALT_KEY
        }
        rows.append(
            {
                "cache": cache.subject,
                "differs": differences(signed, here),
                "signers": list(cache.signers),
                "signed_by": list(cache.signed_by),
                "has_rank": _has_rank(manifest, rank),
            }
        )
    rows.sort(key=lambda r: (len(r["differs"]), not r["has_rank"], r["cache"]))
    match = next((r for r in rows if not r["differs"] and r["has_rank"]), None)
    out: dict[str, Any] = {"not_compared": not_compared}
    if match is not None:
        out.update(
            decision="load",
            reason="verified",
            cache=match["cache"],
            differs=[],
            candidates=[],
            detail="signed factors equal this node's "
            "(vLLM compares the traced code's hash at load)",
        )
        return out
    same = next((r for r in rows if not r["differs"]), None)
    if same is not None:
        out.update(
            decision="compile",
            reason="no-rank-artifacts",
            cache=same["cache"],
            differs=[],
            detail=f"the matching cache holds no artifacts for rank {rank}",
        )
    else:
        out.update(
            decision="compile",
            reason="no-cache",
            cache=None,
            differs=[],
            detail="no verified compile cache with this node's factors",
        )
    out["candidates"] = rows[:nearest]
    return out
