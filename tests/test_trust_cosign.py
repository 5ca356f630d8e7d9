"""sign_or_cosign: what ``plancache sign`` does to one plan, and what it refuses to adopt."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from conftest import FP, NOW, keyring_of, make_signer, plan_bytes
from plancache.trust import envelope as dsse
from plancache.trust.errors import ConfigError, Reason, Rejected
from plancache.trust.keyring.keys import Ed25519Signer, Keyring
from plancache.trust.plans.plan import plan_name
from plancache.trust.signing import sign_or_cosign, sign_plan
from plancache.trust.statement import Statement, parse_statement
from plancache.trust.verify import verify_plan

NAME = plan_name(FP)
DATA = plan_bytes()
LATER = NOW + timedelta(days=1)
FACTS = {"gpu_memory_utilization": 0.9}


def statement_of(sig: bytes) -> Statement:
    return parse_statement(dsse.decode(sig).payload)


def refused(reason: Reason, *args: Any, **kwargs: Any) -> Rejected:
    with pytest.raises(Rejected) as info:
        sign_or_cosign(*args, **kwargs)
    assert info.value.reason is reason, info.value
    assert "\n" not in info.value.detail
    return info.value


def test_no_sidecar_signs_and_the_result_verifies() -> None:
    ci = make_signer()
    action, sig = sign_or_cosign(
        NAME, DATA, None, ci, NOW, keyring=None, expires_at=LATER, comment=None, provenance=FACTS
    )
    assert action == "signed"
    vp = verify_plan(NAME, DATA, sig, keyring_of(ci), NOW)
    assert vp.statement is not None and (vp.statement.comment, dict(vp.statement.provenance)) == (
        "",
        FACTS,
    )


def test_own_valid_signature_is_kept_byte_for_byte() -> None:
    ci = make_signer()
    sig = sign_plan(NAME, DATA, ci, NOW, expires_at=LATER, comment="nightly", provenance=FACTS)
    assert sign_or_cosign(
        NAME,
        DATA,
        sig,
        ci,
        LATER - timedelta(hours=1),
        keyring=None,
        expires_at=LATER + timedelta(days=1),
    ) == (
        "kept",
        sig,
    )
    assert (
        sign_or_cosign(NAME, DATA, sig, ci, NOW, keyring=None, comment="nightly", provenance=FACTS)[
            0
        ]
        == "kept"
    )


def test_own_key_id_beside_garbage_is_not_kept() -> None:
    """Today's bug: `sign` said co-signed when its key id merely sat beside garbage bytes."""
    ci = make_signer()
    env = dsse.decode(sign_plan(NAME, DATA, ci, NOW))
    planted = dsse.encode(
        dsse.Envelope(env.payload_type, env.payload, (dsse.Signature(ci.keyid, b"\0" * 64),))
    )
    refused(Reason.UNTRUSTED_KEY, NAME, DATA, planted, ci, NOW, keyring=None)
    refused(Reason.BAD_SIGNATURE, NAME, DATA, planted, ci, NOW, keyring=keyring_of(ci))
    action, sig = sign_or_cosign(NAME, DATA, planted, ci, NOW, keyring=None, replace=True)
    assert action == "replaced" and verify_plan(NAME, DATA, sig, keyring_of(ci), NOW).signers == (
        "key0",
    )


def planted_statement(attacker: Ed25519Signer) -> bytes:
    """No expiry, signed_at a year back, conditions of the attacker's choosing."""
    statement = Statement(
        NAME,
        hashlib.sha256(DATA).hexdigest(),
        FP,
        NOW - timedelta(days=365),
        None,
        "",
        {"device_name": "anything"},
    )
    payload = statement.to_json_bytes()
    signature = dsse.Signature(attacker.keyid, attacker.sign(dsse.pae(dsse.PAYLOAD_TYPE, payload)))
    return dsse.encode(dsse.Envelope(dsse.PAYLOAD_TYPE, payload, (signature,)))


def test_a_planted_statement_gets_no_co_signature() -> None:
    ci, attacker = make_signer(), make_signer()
    planted = planted_statement(attacker)
    err = refused(
        Reason.UNTRUSTED_KEY, NAME, DATA, planted, ci, NOW, keyring=keyring_of(ci), expires_at=LATER
    )
    assert err.detail.startswith("cannot co-sign: ")
    refused(Reason.UNTRUSTED_KEY, NAME, DATA, planted, ci, NOW, keyring=None)
    action, sig = sign_or_cosign(
        NAME, DATA, planted, ci, NOW, keyring=keyring_of(ci), expires_at=LATER, replace=True
    )
    assert action == "replaced" and len(dsse.decode(sig).signatures) == 1
    fresh = statement_of(sig)
    assert (fresh.signed_at, fresh.expires_at, dict(fresh.provenance)) == (NOW, LATER, {})


def test_a_vouched_statement_is_co_signed_towards_a_threshold() -> None:
    first, second = make_signer(), make_signer()
    sig = sign_plan(NAME, DATA, first, NOW, expires_at=LATER, comment="nightly", provenance=FACTS)
    both = keyring_of(first, second, threshold=2)
    action, cosigned = sign_or_cosign(
        NAME,
        DATA,
        sig,
        second,
        NOW,
        keyring=both,
        expires_at=LATER,
        comment="nightly",
        provenance=FACTS,
    )
    assert action == "co-signed" and statement_of(cosigned) == statement_of(sig)
    assert len(verify_plan(NAME, DATA, cosigned, both, NOW).signers) == 2
    assert sign_or_cosign(NAME, DATA, cosigned, second, NOW, keyring=both) == ("kept", cosigned)


@pytest.mark.parametrize(
    ("request_", "why"),
    [
        ({"expires_at": LATER - timedelta(hours=1)}, "later than the requested"),
        ({"comment": "other"}, "comment"),
        ({"provenance": {}}, "provenance"),
        ({"provenance": {"gpu_memory_utilization": 0.8}}, "provenance"),
    ],
)
def test_a_statement_that_says_something_else_is_not_adopted(
    request_: dict[str, object], why: str
) -> None:
    first, second = make_signer(), make_signer()
    sig = sign_plan(NAME, DATA, first, NOW, expires_at=LATER, comment="nightly", provenance=FACTS)
    err = refused(
        Reason.STATEMENT_MISMATCH,
        NAME,
        DATA,
        sig,
        second,
        NOW,
        keyring=keyring_of(first),
        **request_,
    )
    assert why in err.detail
    # nor kept
    refused(Reason.STATEMENT_MISMATCH, NAME, DATA, sig, first, NOW, keyring=None, **request_)
    action, replaced = sign_or_cosign(
        NAME, DATA, sig, second, NOW, keyring=keyring_of(first), replace=True, **request_
    )
    assert action == "replaced" and [s.keyid for s in dsse.decode(replaced).signatures] == [
        second.keyid
    ]


def test_no_expiry_is_later_than_any_requested_expiry() -> None:
    first, second = make_signer(), make_signer()
    sig = sign_plan(NAME, DATA, first, NOW)
    refused(
        Reason.STATEMENT_MISMATCH,
        NAME,
        DATA,
        sig,
        second,
        NOW,
        keyring=keyring_of(first),
        expires_at=LATER,
    )
    assert sign_or_cosign(NAME, DATA, sig, second, NOW, keyring=keyring_of(first))[0] == "co-signed"


@pytest.mark.parametrize(
    ("sidecar", "reason"),
    [
        (b"garbage", Reason.MALFORMED),
        (sign_plan(NAME, plan_bytes(kv=1), make_signer(), NOW), Reason.UNTRUSTED_KEY),
    ],
)
def test_unusable_sidecars_are_refused_or_replaced(sidecar: bytes, reason: Reason) -> None:
    ci = make_signer()
    refused(reason, NAME, DATA, sidecar, ci, NOW, keyring=keyring_of(ci))
    assert (
        sign_or_cosign(NAME, DATA, sidecar, ci, NOW, keyring=keyring_of(ci), replace=True)[0]
        == "replaced"
    )


def test_other_bytes_or_expired_statements_are_not_co_signed() -> None:
    first, second = make_signer(), make_signer()
    other_plan = sign_plan(NAME, plan_bytes(kv=1), first, NOW)
    refused(Reason.DIGEST_MISMATCH, NAME, DATA, other_plan, second, NOW, keyring=keyring_of(first))
    expired = sign_plan(
        NAME, DATA, first, NOW - timedelta(days=2), expires_at=NOW - timedelta(days=1)
    )
    refused(Reason.EXPIRED, NAME, DATA, expired, second, NOW, keyring=keyring_of(first))


@dataclass(frozen=True)
class BrokenSigner:
    """A signer (a misconfigured KMS, say) whose signatures do not verify."""

    inner: Ed25519Signer

    @property
    def keyid(self) -> str:
        return self.inner.keyid

    @property
    def public(self) -> Ed25519PublicKey:
        return self.inner.public

    def sign(self, data: bytes) -> bytes:
        return bytes(64)


def test_the_result_is_verified_before_it_is_returned() -> None:
    broken = BrokenSigner(make_signer())
    err = refused(Reason.BAD_SIGNATURE, NAME, DATA, None, broken, NOW, keyring=None)
    assert "own key" in err.detail


def test_bad_requests_are_config_errors() -> None:
    ci, other = make_signer(), make_signer()
    for kwargs in (
        {"expires_at": NOW},
        {"provenance": {"colour": "blue"}},
        {"provenance": {"rank": True}},
    ):
        with pytest.raises(ConfigError):
            sign_or_cosign(NAME, DATA, None, ci, NOW, keyring=None, **kwargs)
    with pytest.raises(ConfigError):
        sign_or_cosign(
            NAME,
            DATA,
            None,
            ci,
            NOW,
            keyring=keyring_of(other).merged(Keyring(revoked=frozenset({ci.keyid}))),
        )

    @dataclass(frozen=True)
    class Liar(BrokenSigner):
        @property
        def keyid(self) -> str:
            return other.keyid

        def sign(self, data: bytes) -> bytes:
            return self.inner.sign(data)

    with pytest.raises(ConfigError):
        sign_or_cosign(NAME, DATA, None, Liar(ci), NOW, keyring=None)
    with pytest.raises(Rejected) as info:
        sign_or_cosign(NAME, plan_bytes(kv=100, baseline=10), None, ci, NOW, keyring=None)
    assert info.value.reason is Reason.BASELINE_BELOW_KV


@pytest.mark.parametrize(
    "facts",
    [
        {"gpu_memory_utilization": float("nan")},
        {"gpu_memory_utilization": float("inf")},
        {"gpu_memory_utilization": 1.5},
        {"gpu_memory_utilization": 0},
        {"device_total_memory": -1},
    ],
)
def test_nonsense_conditions_are_never_signed(facts: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        sign_or_cosign(NAME, DATA, None, make_signer(), NOW, keyring=None, provenance=facts)
