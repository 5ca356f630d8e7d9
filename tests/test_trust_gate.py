"""The free-memory gate and the signed conditions."""

from __future__ import annotations

from datetime import timedelta

from conftest import FP, GIB, NOW, keyring_of, make_signer, plan_bytes
from plancache.trust.errors import Reason, Rejected
from plancache.trust.plans.gate import Decision, Verdict, decide
from plancache.trust.plans.plan import plan_name
from plancache.trust.signing import sign_plan
from plancache.trust.verify import admit_unsigned, verify_plan

NAME = plan_name(FP)


def verified(**provenance: object):
    signer = make_signer()
    data = plan_bytes(kv=20 * GIB, baseline=70 * GIB)
    sig = sign_plan(
        NAME, data, signer, NOW, expires_at=NOW + timedelta(days=1), provenance=provenance
    )
    return verify_plan(NAME, data, sig, keyring_of(signer), NOW)


def test_applies_at_or_above_baseline() -> None:
    vp = verified()
    for free in (70 * GIB, 80 * GIB):
        d = decide(vp, free)
        assert d == Decision(True, Verdict.APPLIED, "", 20 * GIB, FP)


def test_below_baseline_profiles() -> None:
    d = decide(verified(), 70 * GIB - 1)
    assert (d.applied, d.reason, d.kv_cache_memory_bytes) == (False, Verdict.BELOW_BASELINE, None)


def test_free_memory_must_be_a_byte_count() -> None:
    vp = verified()
    for bogus in (True, 80.0 * GIB, -1, None):
        d = decide(vp, bogus)  # type: ignore[arg-type]  # not a byte count, on purpose
        assert (d.applied, d.reason, d.kv_cache_memory_bytes) == (False, Reason.INTERNAL, None)
        assert "free memory is not a byte count" in d.detail


def test_conditions_must_match_when_both_sides_know_them() -> None:
    vp = verified(
        gpu_memory_utilization=0.9,
        device_name="NVIDIA H100 80GB HBM3",
        device_total_memory=80 * GIB,
    )
    same = {
        "gpu_memory_utilization": 0.9,
        "device_name": "NVIDIA H100 80GB HBM3",
        "device_total_memory": 80 * GIB,
    }
    assert decide(vp, 80 * GIB, same).applied
    for key, other in (
        ("gpu_memory_utilization", 0.8),
        ("device_name", "NVIDIA A100"),
        ("device_total_memory", 40 * GIB),
    ):
        d = decide(vp, 80 * GIB, {**same, key: other})
        assert (d.applied, d.reason) == (False, Verdict.CONDITION_MISMATCH) and key in d.detail
    assert decide(vp, 80 * GIB, {"gpu_memory_utilization": None}).applied
    assert decide(verified(), 80 * GIB, same).applied  # plan recorded no conditions


def test_unsigned_admission_is_gated_too() -> None:
    vp = admit_unsigned(NAME, plan_bytes(kv=20 * GIB, baseline=70 * GIB))
    assert decide(vp, 70 * GIB).kv_cache_memory_bytes == 20 * GIB
    assert decide(vp, GIB).reason is Verdict.BELOW_BASELINE


def test_rejections_become_decisions() -> None:
    d = Decision.rejected(Rejected(Reason.EXPIRED, "old"), FP)
    assert (d.applied, d.reason, d.detail, d.fingerprint) == (False, Reason.EXPIRED, "old", FP)
    assert str(Reason.EXPIRED) == "expired"
