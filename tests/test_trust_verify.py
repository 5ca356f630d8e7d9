"""Verification: every way a plan and its signature can be wrong ends in its documented reason."""

from __future__ import annotations

import base64
import json
import pickle
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from conftest import FP, NOW, keyring_of, make_signer, plan_bytes
from plancache.trust import envelope as dsse
from plancache.trust import strictjson
from plancache.trust.errors import ConfigError, PlanCacheError, Reason, Rejected
from plancache.trust.keyring.keys import Ed25519Signer, Keyring
from plancache.trust.plans.plan import parse_plan, plan_name
from plancache.trust.signing import add_signature, sign_plan
from plancache.trust.statement import Statement, parse_statement
from plancache.trust.verify import VerifiedPlan, admit_unsigned, verify_plan

NAME = plan_name(FP)


def rejected(reason: Reason, *args: Any, **kwargs: Any) -> PlanCacheError:
    with pytest.raises(PlanCacheError) as info:
        verify_plan(*args, **kwargs)
    assert info.value.reason is reason, info.value
    return info.value


def test_valid_plan_verifies(signer: Ed25519Signer, signed: tuple[str, bytes, bytes]) -> None:
    name, data, sig = signed
    vp = verify_plan(name, data, sig, keyring_of(signer), NOW)
    assert vp.plan == parse_plan(data, name)
    assert vp.signers == ("key0",)
    assert vp.statement is not None and vp.statement.signed_at == NOW


def single_byte_changes(data: bytes) -> Iterator[bytes]:
    """Every byte of ``data`` replaced by each of the 255 other values, one at a time."""
    for position in range(len(data)):
        for value in range(256):
            if value != data[position]:
                yield data[:position] + bytes([value]) + data[position + 1 :]


def rejection_reasons(
    changes: Iterable[tuple[bytes, bytes]], name: str, keyring: Keyring
) -> set[Reason]:
    """Verify every (plan, sidecar) pair; each must be rejected. Returns the reasons seen."""
    reasons = set()
    for plan, sig in changes:
        with pytest.raises(PlanCacheError) as info:
            verify_plan(name, plan, sig, keyring, NOW)
        reasons.add(info.value.reason)
    return reasons


def test_every_single_byte_change_of_the_plan_is_rejected(
    signer: Ed25519Signer, signed: tuple[str, bytes, bytes]
) -> None:
    name, data, sig = signed
    changes = ((altered, sig) for altered in single_byte_changes(data))
    assert rejection_reasons(changes, name, keyring_of(signer)) == {Reason.DIGEST_MISMATCH}


def test_every_single_byte_change_of_the_sidecar_is_rejected(
    signer: Ed25519Signer, signed: tuple[str, bytes, bytes]
) -> None:
    name, data, sig = signed
    changes = ((data, altered) for altered in single_byte_changes(sig))
    reasons = rejection_reasons(changes, name, keyring_of(signer))
    assert reasons <= {Reason.MALFORMED, Reason.BAD_SIGNATURE, Reason.UNTRUSTED_KEY}
    assert Reason.BAD_SIGNATURE in reasons  # payload or sig bits flipped, still well-formed


def test_truncated_or_extended_sidecar_is_rejected(
    signer: Ed25519Signer, signed: tuple[str, bytes, bytes]
) -> None:
    name, data, sig = signed
    for altered in (sig[:-1], sig + b"\n", b" " + sig, sig.replace(b",", b", ", 1)):
        rejected(Reason.MALFORMED, name, data, altered, keyring_of(signer), NOW)


def test_plan_renamed_to_another_fingerprint_is_rejected(
    signer: Ed25519Signer, signed: tuple[str, bytes, bytes]
) -> None:
    _, data, sig = signed
    rejected(
        Reason.NAME_MISMATCH, plan_name("fedcba9876543210"), data, sig, keyring_of(signer), NOW
    )


def test_statement_for_other_fingerprint_is_rejected(signer: Ed25519Signer) -> None:
    """A signer's statement naming file A but fingerprint B (a buggy or hostile signer tool)."""
    data = plan_bytes()
    import hashlib

    statement = Statement(NAME, hashlib.sha256(data).hexdigest(), "fedcba9876543210", NOW)
    payload = statement.to_json_bytes()
    env = dsse.Envelope(
        dsse.PAYLOAD_TYPE,
        payload,
        (dsse.Signature(signer.keyid, signer.sign(dsse.pae(dsse.PAYLOAD_TYPE, payload))),),
    )
    rejected(Reason.FINGERPRINT_MISMATCH, NAME, data, dsse.encode(env), keyring_of(signer), NOW)


def test_wrong_key_is_untrusted(signed: tuple[str, bytes, bytes]) -> None:
    name, data, sig = signed
    rejected(Reason.UNTRUSTED_KEY, name, data, sig, keyring_of(make_signer()), NOW)


def test_keyid_alone_grants_nothing(signer: Ed25519Signer) -> None:
    """A signature by an untrusted key that claims a trusted key's id is a bad signature."""
    data = plan_bytes()
    impostor = make_signer()
    sig = sign_plan(NAME, data, impostor, NOW)
    env = dsse.decode(sig)
    forged = dsse.Envelope(
        env.payload_type, env.payload, (dsse.Signature(signer.keyid, env.signatures[0].sig),)
    )
    rejected(Reason.BAD_SIGNATURE, NAME, data, dsse.encode(forged), keyring_of(signer), NOW)


def test_revoked_key(signer: Ed25519Signer, signed: tuple[str, bytes, bytes]) -> None:
    name, data, sig = signed
    keyring = keyring_of(signer).merged(Keyring(revoked=frozenset({signer.keyid})))
    assert signer.keyid not in keyring.keys
    rejected(Reason.REVOKED, name, data, sig, keyring, NOW)


def test_expired_and_clock_skew(signer: Ed25519Signer, signed: tuple[str, bytes, bytes]) -> None:
    name, data, sig = signed
    keyring = keyring_of(signer)
    expiry = NOW + timedelta(days=30)
    # within the default 5 min skew
    verify_plan(name, data, sig, keyring, expiry + timedelta(minutes=4))
    err = rejected(Reason.EXPIRED, name, data, sig, keyring, expiry + timedelta(minutes=6))
    assert "expired" in err.detail
    rejected(Reason.EXPIRED, name, data, sig, keyring, expiry, clock_skew=timedelta(0))


def test_not_yet_valid(signer: Ed25519Signer, signed: tuple[str, bytes, bytes]) -> None:
    name, data, sig = signed
    rejected(Reason.NOT_YET_VALID, name, data, sig, keyring_of(signer), NOW - timedelta(hours=1))
    verify_plan(name, data, sig, keyring_of(signer), NOW - timedelta(minutes=4))


def test_key_validity_window_covers_now_and_signed_at(
    signer: Ed25519Signer, signed: tuple[str, bytes, bytes]
) -> None:
    """After valid-before a key vouches for nothing, even for what it signed while current
    (tests/test_trust_rotation.py shows how plans move to a new key first)."""
    name, data, sig = signed
    retired = keyring_of(signer, valid_before=NOW)
    rejected(Reason.EXPIRED, name, data, sig, retired, NOW + timedelta(days=1))
    rotated_out_later = keyring_of(signer, valid_before=NOW + timedelta(days=2))
    verify_plan(name, data, sig, rotated_out_later, NOW + timedelta(days=1))
    rejected(Reason.EXPIRED, name, data, sig, rotated_out_later, NOW + timedelta(days=2))
    rejected(
        Reason.EXPIRED,
        name,
        data,
        sig,
        keyring_of(signer, valid_after=NOW + timedelta(days=1)),
        NOW,
    )


def test_key_ids_compare_with_or_without_base64_padding(
    signer: Ed25519Signer, signed: tuple[str, bytes, bytes]
) -> None:
    name, data, sig = signed
    env = dsse.decode(sig)
    padded = dsse.encode(
        dsse.Envelope(
            env.payload_type,
            env.payload,
            (dsse.Signature(signer.keyid + "=", env.signatures[0].sig),),
        )
    )
    assert verify_plan(name, data, padded, keyring_of(signer), NOW).signers == ("key0",)
    revoked = keyring_of(signer).merged(Keyring(revoked=frozenset({signer.keyid})))
    rejected(Reason.REVOKED, name, data, padded, revoked, NOW)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    # an unused low bit set
    alias = signer.keyid[:-1] + alphabet[alphabet.index(signer.keyid[-1]) ^ 1]
    aliased = dsse.encode(
        dsse.Envelope(
            env.payload_type, env.payload, (dsse.Signature(alias, env.signatures[0].sig),)
        )
    )
    rejected(Reason.UNTRUSTED_KEY, name, data, aliased, keyring_of(signer), NOW)


def test_at_most_sixteen_signatures(
    signer: Ed25519Signer, signed: tuple[str, bytes, bytes]
) -> None:
    """The bound holds even when every signature is valid: 17 is refused before any is checked."""
    name, data, sig = signed
    env = dsse.decode(sig)
    sixteen = dsse.encode(
        dsse.Envelope(env.payload_type, env.payload, env.signatures * dsse.MAX_SIGNATURES)
    )
    verify_plan(name, data, sixteen, keyring_of(signer), NOW)
    seventeen = dsse.encode(dsse.Envelope(env.payload_type, env.payload, env.signatures * 17))
    assert dsse.MAX_SIGNATURES == 16
    err = rejected(Reason.MALFORMED, name, data, seventeen, keyring_of(signer), NOW)
    assert "16" in err.detail


def test_unsigned(signer: Ed25519Signer) -> None:
    rejected(Reason.UNSIGNED, NAME, plan_bytes(), None, keyring_of(signer), NOW)


def test_one_key_signing_twice_does_not_meet_threshold_two(
    signer: Ed25519Signer, signed: tuple[str, bytes, bytes]
) -> None:
    name, data, sig = signed
    env = dsse.decode(sig)
    twice = dsse.encode(dsse.Envelope(env.payload_type, env.payload, env.signatures * 2))
    keyring = keyring_of(signer, make_signer(), threshold=2)
    rejected(Reason.THRESHOLD, name, data, twice, keyring, NOW)
    second = make_signer()
    cosigned = add_signature(name, data, sig, second)
    assert add_signature(name, data, cosigned, second) == cosigned  # idempotent
    vp = verify_plan(name, data, cosigned, keyring_of(signer, second, threshold=2), NOW)
    assert len(vp.signers) == 2


def test_co_signing_refuses_a_sidecar_for_other_bytes(
    signer: Ed25519Signer, signed: tuple[str, bytes, bytes]
) -> None:
    name, _, sig = signed
    with pytest.raises(PlanCacheError) as info:
        add_signature(name, plan_bytes(kv=1), sig, make_signer())
    assert info.value.reason is Reason.DIGEST_MISMATCH


def test_co_signing_replaces_an_own_entry_that_does_not_verify(
    signer: Ed25519Signer, signed: tuple[str, bytes, bytes]
) -> None:
    """A sidecar already naming the co-signer's key id beside garbage bytes is not 'done'."""
    name, data, sig = signed
    second = make_signer()
    env = dsse.decode(sig)
    planted = dsse.encode(
        dsse.Envelope(
            env.payload_type,
            env.payload,
            (*env.signatures, dsse.Signature(second.keyid, b"\x00" * 64)),
        )
    )
    cosigned = add_signature(name, data, planted, second)
    assert cosigned != planted and len(dsse.decode(cosigned).signatures) == 2
    assert (
        len(verify_plan(name, data, cosigned, keyring_of(signer, second, threshold=2), NOW).signers)
        == 2
    )


def test_wrong_payload_type(signer: Ed25519Signer, signed: tuple[str, bytes, bytes]) -> None:
    name, data, sig = signed
    env = dsse.decode(sig)
    other = "application/json"
    resigned = dsse.Envelope(
        other,
        env.payload,
        (dsse.Signature(signer.keyid, signer.sign(dsse.pae(other, env.payload))),),
    )
    rejected(Reason.MALFORMED, name, data, dsse.encode(resigned), keyring_of(signer), NOW)


def test_oversized_inputs_are_refused_before_parsing(
    signer: Ed25519Signer, signed: tuple[str, bytes, bytes]
) -> None:
    name, data, sig = signed
    rejected(Reason.TOO_LARGE, name, data + b" " * 70_000, sig, keyring_of(signer), NOW)
    rejected(Reason.TOO_LARGE, name, data, sig + b" " * 70_000, keyring_of(signer), NOW)


def test_signing_refuses_malformed_plans(signer: Ed25519Signer) -> None:
    # numbers that cannot be right: each its own reason at signing (issue 49)
    with pytest.raises(PlanCacheError) as info:
        sign_plan(NAME, plan_bytes(kv=100, baseline=10), signer, NOW)
    assert info.value.reason is Reason.BASELINE_BELOW_KV
    for kv in (0, -5):
        with pytest.raises(PlanCacheError) as info:
            sign_plan(NAME, plan_bytes(kv=kv, baseline=10), signer, NOW)
        assert info.value.reason is Reason.KV_NOT_POSITIVE
    with pytest.raises(PlanCacheError) as info:
        sign_plan(
            NAME,
            plan_bytes(kv=100, baseline=200),
            signer,
            NOW,
            provenance={"device_total_memory": 150},
        )
    assert info.value.reason is Reason.KV_ABOVE_DEVICE
    with pytest.raises(PlanCacheError):
        sign_plan(NAME, plan_bytes(), signer, NOW, provenance={"gpu_memory_utilization": True})
    with pytest.raises(PlanCacheError):
        sign_plan(NAME, plan_bytes(), signer, NOW, provenance={"unknown": 1})


def test_verified_plan_cannot_be_forged_by_callers() -> None:
    with pytest.raises(TypeError):
        VerifiedPlan(NAME, parse_plan(plan_bytes(), NAME), plan_bytes(), None, None, ())
    assert admit_unsigned(NAME, plan_bytes()).signers == ()


def test_keyring_and_errors_pickle_for_process_pools(
    signer: Ed25519Signer, signed: tuple[str, bytes, bytes]
) -> None:
    name, data, sig = signed
    keyring = pickle.loads(pickle.dumps(keyring_of(signer)))
    assert verify_plan(name, data, sig, keyring, NOW).signers == ("key0",)
    err = pickle.loads(pickle.dumps(PlanCacheError(Reason.REVOKED, "x")))
    assert (err.reason, err.detail) == (Reason.REVOKED, "x")


def test_statement_round_trip(signed: tuple[str, bytes, bytes]) -> None:
    st_ = parse_statement(dsse.decode(signed[2]).payload)
    assert (
        st_.subject_name == NAME
        and st_.fingerprint == FP
        and st_.expires_at == NOW + timedelta(days=30)
    )


def test_evidence_is_signed_checked_and_absent_from_old_statements(
    signer: Ed25519Signer, signed: tuple[str, bytes, bytes]
) -> None:
    """Issue 49: the evidence is signed and read back; a statement without it (every plan signed
    before) still verifies, with empty evidence; evidence of the wrong shape is never signed."""
    statement = verify_plan(*signed, keyring_of(signer), NOW).statement
    assert statement is not None and statement.evidence == {}
    evidence = {
        "vllm_version": "0.33.0",
        "torch_version": "2.13.0",
        "compile": "warm",
        "weights_memory": 1 << 30,
        "peak_activation_memory": 1 << 29,
    }
    data = plan_bytes()
    sig = sign_plan(NAME, data, signer, NOW, evidence=evidence)
    statement = verify_plan(NAME, data, sig, keyring_of(signer), NOW).statement
    assert statement is not None and dict(statement.evidence) == evidence
    for bad in (
        {"compile": "lukewarm"},
        {"weights_memory": -1},
        {"weights_memory": True},
        {"gpu": "x"},
    ):
        with pytest.raises(ConfigError):
            sign_plan(NAME, data, signer, NOW, evidence=bad)


def test_evidence_of_a_newer_version_never_costs_the_plan(
    signer: Ed25519Signer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newer plancache signs a compile state or a number this version does not know: the plan
    still verifies, the facts it cannot use are left out (red team 49: the whole plan was
    rejected as malformed, so every older node profiled)."""
    import plancache.trust.signing as signing

    newer = {"vllm_version": "0.34.0", "compile": "aot-warm", "weights_memory": 1.5e9}
    monkeypatch.setattr(signing, "check_evidence", dict)  # a newer signer's checks
    data = plan_bytes()
    sig = sign_plan(NAME, data, signer, NOW, evidence=newer)
    statement = verify_plan(NAME, data, sig, keyring_of(signer), NOW).statement
    assert statement is not None and dict(statement.evidence) == {"vllm_version": "0.34.0"}


# Fuzzing: hostile bytes only ever produce Rejected, with a reason that parser may give.
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
_PLAN_REASONS = {Reason.MALFORMED, Reason.TOO_LARGE, Reason.FINGERPRINT_MISMATCH}
_STATEMENT_REASONS = {Reason.MALFORMED}
_RANDOM_SIDECAR_REASONS = {Reason.MALFORMED, Reason.TOO_LARGE, Reason.UNTRUSTED_KEY}
"""No random sidecar names a trusted key id, so it can fail only before or at the key lookup."""


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400) | _json_values.map(lambda v: json.dumps(v).encode()))
def test_fuzz_plan_parser(data: bytes) -> None:
    rejected: Rejected | None = None
    try:
        parse_plan(data, NAME)
    except Rejected as exc:
        rejected = exc
    assert rejected is None or rejected.reason in _PLAN_REASONS, rejected


_envelopes = st.fixed_dictionaries(
    {
        "payload": st.one_of(
            st.text(max_size=40),
            st.binary(max_size=60).map(lambda b: base64.b64encode(b).decode()),
            _json_values,
        ),
        "payloadType": st.one_of(st.just(dsse.PAYLOAD_TYPE), st.text(max_size=10), _json_values),
        "signatures": st.one_of(
            _json_values,
            st.lists(
                st.fixed_dictionaries(
                    {
                        "keyid": st.text(max_size=10),
                        "sig": st.binary(max_size=70).map(lambda b: base64.b64encode(b).decode()),
                    }
                ),
                max_size=3,
            ),
        ),
    }
)


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=400)
    | _envelopes.map(
        lambda v: json.dumps(v, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    )
)
def test_fuzz_envelope_and_verifier(sig: bytes) -> None:
    keyring = keyring_of(make_signer())
    with pytest.raises(Rejected) as rejected:  # a random envelope never verifies
        verify_plan(NAME, plan_bytes(), sig, keyring, NOW)
    assert rejected.value.reason in _RANDOM_SIDECAR_REASONS, rejected.value


@settings(max_examples=200, deadline=None)
@given(_json_values.map(lambda v: json.dumps(v).encode()) | st.binary(max_size=300))
def test_fuzz_statement_parser(payload: bytes) -> None:
    rejected: Rejected | None = None
    try:
        parse_statement(payload)
    except Rejected as exc:
        rejected = exc
    assert rejected is None or rejected.reason in _STATEMENT_REASONS, rejected


@given(
    keyids=st.lists(st.text(max_size=12), min_size=1, max_size=3),
    payload_type=st.text(max_size=12),
    payload=st.binary(max_size=64),
    with_ext=st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_encode_is_the_sorted_compact_json_dump(
    keyids: list[str], payload_type: str, payload: bytes, with_ext: bool
) -> None:
    """``encode`` spells the canonical form out: it must stay byte for byte the dump of the
    envelope as a dict (sorted keys, no spaces, ASCII), whatever a key id or type holds."""
    sigs = [dsse.Signature(k, k.encode("utf-8", "surrogatepass")[:8]) for k in keyids]
    if with_ext:
        sigs.append(dsse.Signature("", b"s", {"z": ["\u00e9", 1], "a": "\u2028"}))
    env = dsse.Envelope(payload_type, payload, tuple(sigs))
    entries: list[dict[str, Any]] = []
    for s in sigs:
        entry: dict[str, Any] = {"keyid": s.keyid, "sig": base64.b64encode(s.sig).decode()}
        if s.ext is not None:
            entry["extension"] = {"ext": s.ext, "kind": dsse.SIGSTORE_EXTENSION}
        entries.append(entry)
    dumped = json.dumps(
        {
            "payload": base64.b64encode(payload).decode(),
            "payloadType": payload_type,
            "signatures": entries,
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
    )
    assert dsse.encode(env) == (dumped + "\n").encode("ascii")


def _read_both_ways(data: bytes) -> tuple[object, object]:
    """``decode``'s answer and the general JSON path's (``_decode_any``) for the same bytes: an
    envelope, or the reason and detail of the refusal."""

    def answer(read: Any) -> object:
        try:
            return read(data)
        except Rejected as exc:
            return exc.reason, exc.detail

    named = min(data.count(b'"extension":'), dsse.MAX_SIGNATURES)
    return answer(dsse.decode), answer(lambda d: dsse._decode_any(d, dsse.MAX_SIG_BYTES, named))


@given(
    keyid=st.text(max_size=24),
    payload_type=st.text(max_size=32),
    payload=st.binary(max_size=96),
    sig=st.binary(max_size=72),
    at=st.integers(0, 10**6),
    byte=st.integers(-1, 255),
)
@settings(max_examples=400, deadline=None)
def test_a_one_key_sidecar_reads_the_same_on_the_fast_path_as_by_json(
    keyid: str, payload_type: str, payload: bytes, sig: bytes, at: int, byte: int
) -> None:
    """``decode`` reads one key's canonical sidecar by a pattern (``_one_key``), anything else by
    JSON: for a sidecar of any key id, type, payload and signature, and the same with one byte
    replaced or (-1) removed, both give the same envelope or the same refusal."""
    data = dsse.encode(dsse.Envelope(payload_type, payload, (dsse.Signature(keyid, sig),)))
    at %= len(data)
    edited = data[:at] + (bytes([byte]) if byte >= 0 else b"") + data[at + 1 :]
    for variant in (data, edited):
        fast, general = _read_both_ways(variant)
        assert fast == general


def test_the_fast_path_refuses_what_the_canonical_form_refuses(
    signed: tuple[str, bytes, bytes],
) -> None:
    """The sidecars a pattern could mistake for canonical: base64 with its unused bits set, with
    padding inside, without padding, a string spelled with an escape, a space, no newline, two
    newlines. Each is refused, for the reason and in the words the JSON path gives; and a real
    sidecar takes the fast path (no JSON parse), so the comparison above is not vacuous."""
    _, _, sig = signed
    env = dsse.decode(sig)
    assert dsse._one_key(sig) == env
    payload_b64 = base64.b64encode(env.payload)
    sig_b64 = base64.b64encode(env.signatures[0].sig)
    assert sig_b64.endswith(b"==")  # a 64-byte Ed25519 signature: 4 unused bits before "=="
    alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    unused_bit = sig_b64[:-3] + alphabet[alphabet.index(sig_b64[-3]) ^ 1 :][:1] + b"=="
    assert base64.b64decode(unused_bit) == env.signatures[0].sig
    variants = [
        sig.replace(sig_b64, unused_bit),
        sig.replace(sig_b64, sig_b64[:4] + b"=" + sig_b64[5:]),
        sig.replace(sig_b64, sig_b64.rstrip(b"=")),
        sig.replace(payload_b64[:8], payload_b64[:8] + b"\\u0041", 1),
        sig.replace(b'"payloadType":"application', b'"payloadType":"\\u0061pplication'),
        sig.replace(b'"keyid":"', b'"keyid":"\\u0053', 1),
        sig.replace(b'"sig":', b'"sig": '),
        sig[:-1],
        sig + b"\n",
    ]
    for variant in variants:
        assert variant != sig
        assert dsse._one_key(variant) is None
        fast, general = _read_both_ways(variant)
        assert fast == general
        assert isinstance(fast, tuple) and fast[0] is Reason.MALFORMED


def _read_as_decode_reads(data: bytes) -> object:
    """What ``strictjson.loads`` gave before its fast path: ``JSONDecoder.decode`` whole."""
    try:
        return strictjson._DECODER.decode(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        return Rejected(Reason.MALFORMED, f"doc is not valid JSON ({strictjson._short(exc)})")


@given(
    st.one_of(
        st.binary(max_size=24),
        st.text(alphabet=st.sampled_from(list(' \t\n\r\x0b{}[]":,01aeNI-')), max_size=24).map(
            str.encode
        ),
    )
)
@example(b" {}")
@example(b"{} \n")
@example(b"{}x")
@example(b"{} x")
@example(b"")
@example(b"\n")
@example(b'{"a":1,"a":2} ')
@settings(max_examples=500, deadline=None)
def test_strict_json_reads_every_text_as_the_whole_decoder_does(data: bytes) -> None:
    """``loads`` skips ``decode``'s whitespace patterns when a text starts with a value: for any
    text, the same document, or the same refusal in the same words."""
    try:
        got: object = strictjson.loads(data, "doc")
    except Rejected as exc:
        got = exc
    want = _read_as_decode_reads(data)
    if isinstance(want, Rejected):
        assert isinstance(got, Rejected) and (got.reason, got.detail) == (want.reason, want.detail)
    else:
        assert got == want and not isinstance(got, Rejected)


_RUN = b"A" * (dsse.MAX_SIG_BYTES - 200)
_TAIL = b'","payloadType":"x","signatures":[{"keyid":"k","sig":"AAAA"}]}'


@pytest.mark.parametrize(
    "data",
    [
        b'{"payload":"' + _RUN,
        b'{"payload":"' + _RUN + b"!" + _TAIL + b"\n",
        b'{"payload":"' + _RUN + _TAIL + b"\r\n",
        b'{"payload":"","payloadType":"x","signatures":[{"keyid":"' + _RUN.lower(),
        b'{"payload":"","payloadType":"x","signatures":[{"keyid":"k","sig":"' + _RUN + b'"}]}\r\n',
        b'{"payload":"' + _RUN + _TAIL + b"\n",
    ],
    ids=["unclosed", "bad-character", "crlf", "keyid-unclosed", "sig-crlf", "canonical"],
)
def test_a_long_run_near_the_cap_reads_the_same_both_ways(data: bytes) -> None:
    """The hostile shapes a pattern could spend its time on (a string of 64 KiB the pattern must
    take whole before it fails: each string is taken once, not given back character by
    character, red team 8b; the time is bench_core's to show, not a test's): the fast path and
    JSON agree on them, and only the canonical one is an envelope."""
    fast, general = _read_both_ways(data)
    assert fast == general
    assert isinstance(fast, dsse.Envelope) == (data.endswith(b"}]}\n") and b"!" not in data)


@pytest.mark.parametrize(
    "doc", [b'{"a":1,"a":1}', b'{"x":{"b":1,"c":0,"b":2}}', b'[{"c":1,"d":2,"c":1}]']
)
def test_strict_json_refuses_a_duplicate_key_at_any_depth(doc: bytes) -> None:
    with pytest.raises(Rejected) as caught:
        strictjson.loads(doc, "doc")
    assert caught.value.reason is Reason.MALFORMED
    assert "duplicate key" in caught.value.detail


def _duplicated(sig: bytes, at: bytes, extra: bytes) -> bytes:
    """``sig`` with ``extra`` (a key and value, comma-terminated) spliced in right after the
    first ``at``."""
    assert at in sig
    return sig.replace(at, at + extra, 1)


def test_an_envelope_with_a_duplicate_key_is_refused_at_any_depth(
    signer: Ed25519Signer, signed: tuple[str, bytes, bytes]
) -> None:
    """A repeated key anywhere in an envelope is refused, even one whose last value is the
    genuine one (the value a plain ``json.loads`` keeps), and NaN in an ``ext`` as well: the
    strict reader refuses both, and the canonical re-encode would refuse the repeats too."""
    name, data, sig = signed
    genuine = json.loads(sig)
    other = base64.b64encode(b'{"forged": true}').decode()
    variants = [
        _duplicated(sig, b"{", f'"payload":"{other}",'.encode()),
        _duplicated(sig, b"{", b'"payloadType":"text/plain",'),
        _duplicated(sig, b'"signatures":[{', b'"keyid":"SHA256:forged",'),
        _duplicated(sig, b'"signatures":[{', b'"sig":"AAAA",'),
    ]
    for variant in variants:
        assert json.loads(variant) == genuine  # what a parser keeping the last value sees
        rejected(Reason.MALFORMED, name, data, variant, keyring_of(signer), NOW)
    keyless = dsse.encode(
        dsse.Envelope(dsse.PAYLOAD_TYPE, b"{}", (dsse.Signature("", b"s", {"a": 1}),))
    )
    dsse.decode(keyless)  # well formed: refused below only for the repeated key
    with pytest.raises(Rejected, match="duplicate key"):
        dsse.decode(_duplicated(keyless, b'"ext":{', b'"a":2,'))
    nan = dsse.encode(
        dsse.Envelope(dsse.PAYLOAD_TYPE, b"{}", (dsse.Signature("", b"s", {"a": float("nan")}),))
    )
    assert b'"a":NaN' in nan  # json.dumps writes it back: a canonical comparison would pass it
    with pytest.raises(Rejected, match="NaN is not JSON"):
        dsse.decode(nan)


def test_a_judged_result_keeps_every_field_but_the_verdict(
    signed: tuple[str, bytes, bytes], signer: Ed25519Signer
) -> None:
    """``PlanResult.judged`` builds its result field by field, for speed: a field added to
    ``PlanResult`` and not to it would be dropped by every verification. Each field is set to a
    value of its own here, so one left out, or two swapped, compares unequal."""
    from dataclasses import fields, replace

    from plancache.trust.result import PlanResult

    name, data, sig = signed
    verified = verify_plan(name, data, sig, keyring_of(signer), NOW)
    error = Rejected(Reason.MALFORMED, "x")
    values: dict[str, Any] = {
        "fingerprint": FP,
        "source": "store",
        "plan_bytes": data,
        "sig_bytes": sig,
        "written": True,
        "write_error": Rejected(Reason.STORE_ERROR, "disk full"),
        "note": "a note",
    }
    assert set(values) | {"verified", "error"} == {f.name for f in fields(PlanResult)}
    raw = PlanResult(**values)
    assert raw.judged(verified) == replace(raw, verified=verified)
    assert raw.judged(error=error) == replace(raw, error=error)
