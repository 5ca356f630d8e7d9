"""Key windows against the verifier's clock, and rotating a store's plans to a new key.

As in OpenSSH's allowed_signers, after ``valid-before`` a key vouches for nothing: judged
against ``signed_at`` alone (a date the signer writes), a retired key could still sign a new
plan by backdating it. Rotation is therefore: co-sign with the new key, then retire the old.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from conftest import GIB, NOW, keyring_of, make_signer, plan_bytes
from plancache.trust.errors import PlanCacheError, Reason
from plancache.trust.keyring.keyformat import openssh_line
from plancache.trust.keyring.keys import Ed25519Signer, Keyring
from plancache.trust.keyring.trusted_keys_file import parse_trusted_keys
from plancache.trust.plans.plan import plan_name
from plancache.trust.signing import sign_or_cosign, sign_plan
from plancache.trust.statement import format_time
from plancache.trust.verify import verify_plan

FPS = ("0123456789abcdef", "1111111111111111", "fedcba9876543210")
FACTS = {"gpu_memory_utilization": 0.9, "device_name": "NVIDIA H100 80GB HBM3"}


def reason(name: str, data: bytes, sig: bytes, keyring: Keyring, now=NOW) -> Reason | None:
    try:
        verify_plan(name, data, sig, keyring, now)
    except PlanCacheError as exc:
        return exc.reason
    return None


def test_a_retired_key_vouches_for_nothing_even_for_what_it_signed_while_current() -> None:
    old = make_signer()
    name, data = plan_name(FPS[0]), plan_bytes(FPS[0])
    sig = sign_plan(name, data, old, NOW)
    retired = keyring_of(old, valid_before=NOW + timedelta(days=1))
    assert reason(name, data, sig, retired, NOW + timedelta(hours=23)) is None
    assert reason(name, data, sig, retired, NOW + timedelta(days=1)) is Reason.EXPIRED


def test_a_retired_key_cannot_backdate_a_new_plan() -> None:
    """The attack: a leaked, retired key signs today with signed_at set inside its old window."""
    old = make_signer()
    name, data = plan_name(FPS[0]), plan_bytes(FPS[0], kv=GIB)
    backdated = sign_plan(name, data, old, NOW - timedelta(days=30))
    retired = keyring_of(old, valid_before=NOW - timedelta(days=1))
    assert reason(name, data, backdated, retired) is Reason.EXPIRED


def test_a_key_counts_only_once_its_window_opened_and_only_for_what_it_signed_inside() -> None:
    key = make_signer()
    name, data = plan_name(FPS[0]), plan_bytes(FPS[0])
    sig = sign_plan(name, data, key, NOW)
    assert (
        reason(name, data, sig, keyring_of(key, valid_after=NOW + timedelta(days=1)), NOW)
        is Reason.EXPIRED
    )
    opened_later = keyring_of(key, valid_after=NOW + timedelta(seconds=1))
    # signed before it opened
    assert reason(name, data, sig, opened_later, NOW + timedelta(days=1)) is Reason.EXPIRED


def trusted_keys(old: Ed25519Signer, new: Ed25519Signer | None, retire_at: str | None) -> Keyring:
    """The trusted-keys file of each rotation step, as an operator writes it."""
    lines = [
        f"valid-before={retire_at} {openssh_line(old.public, 'ci-old')}"
        if retire_at
        else openssh_line(old.public, "ci-old")
    ]
    if new is not None:
        lines.append(openssh_line(new.public, "ci-new"))
    return parse_trusted_keys("\n".join(lines) + "\n", "trusted-keys")


def test_rotating_a_stores_plans_to_a_new_key_never_makes_a_boot_profile() -> None:
    old, new = make_signer(), make_signer()
    t0, t1, t2 = NOW, NOW + timedelta(days=10), NOW + timedelta(days=20)
    store = {plan_name(fp): plan_bytes(fp) for fp in FPS}
    sigs = {
        name: sign_plan(name, data, old, t0, expires_at=t0 + timedelta(days=90), provenance=FACTS)
        for name, data in store.items()
    }
    leftover = plan_name("2222222222222222")  # a plan nobody co-signed
    store[leftover] = plan_bytes("2222222222222222")
    sigs[leftover] = sign_plan(
        leftover, store[leftover], old, t0, expires_at=t0 + timedelta(days=90)
    )

    step1 = trusted_keys(old, new, None)  # 1. trust both keys (workers roll out at their pace)
    for name in map(plan_name, FPS):
        action, sigs[name] = sign_or_cosign(name, store[name], sigs[name], new, t1, keyring=step1)
        assert action == "co-signed"  # 2. co-sign the store's plans with the new key
    step3 = trusted_keys(old, new, format_time(t2))  # 3. retire the old key

    # Every worker, whichever keyring it has booted with, verifies every co-signed plan at
    # every moment of the rotation: no boot profiles.
    after = t2 + timedelta(days=1)
    rollout = [
        (trusted_keys(old, None, None), t1),
        (step1, t1),
        (step1, after),
        (step3, t1),
        (step3, after),
    ]
    for keyring, moment in rollout:
        for name in map(plan_name, FPS):
            assert reason(name, store[name], sigs[name], keyring, moment) is None, (name, moment)
    vp = verify_plan(
        plan_name(FPS[0]), store[plan_name(FPS[0])], sigs[plan_name(FPS[0])], step3, after
    )
    assert (
        vp.signers == ("ci-new",)
        and vp.statement is not None
        and dict(vp.statement.provenance) == FACTS
    )
    # A plan left signed by the old key alone stops counting once the old key is retired.
    assert reason(leftover, store[leftover], sigs[leftover], step3, t1) is None
    assert reason(leftover, store[leftover], sigs[leftover], step3, after) is Reason.EXPIRED


def test_the_new_key_must_not_start_after_the_plans_it_co_signs() -> None:
    """A valid-after on the new key later than a plan's signed_at makes the co-signature
    count for nothing: the statement keeps its original signed_at."""
    old, new = make_signer(), make_signer()
    name, data = plan_name(FPS[0]), plan_bytes(FPS[0])
    sig = sign_plan(name, data, old, NOW)
    _, cosigned = sign_or_cosign(
        name, data, sig, new, NOW + timedelta(days=1), keyring=keyring_of(old)
    )
    late_new = Keyring({**keyring_of(new, valid_after=NOW + timedelta(days=1)).keys})
    with pytest.raises(PlanCacheError) as info:
        verify_plan(name, data, cosigned, late_new, NOW + timedelta(days=2))
    assert info.value.reason is Reason.EXPIRED
