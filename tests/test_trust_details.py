"""Error details that embed untrusted strings stay one bounded, printable, UTF-8 line.

A sidecar's keyid is not signed; a statement's strings are signed by *some* key; object and
file names come from listings. None of them may forge a log line, break a terminal, or make
a command die on encoding when it prints the error.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FP, NOW, keyring_of, make_signer, plan_bytes
from plancache.trust import envelope as dsse
from plancache.trust.errors import PlanCacheError
from plancache.trust.keyring.keys import Ed25519Signer, Keyring
from plancache.trust.keyring.trusted_keys_file import parse_trusted_keys
from plancache.trust.plans.plan import parse_plan, plan_name
from plancache.trust.statement import Statement, parse_statement
from plancache.trust.verify import verify_plan

NAME = plan_name(FP)
MAX_DETAIL = 1200
FORGED = "SHA256:x\nplancache: decision=apply reason=applied kv_cache_memory_bytes=1"


def assert_safe(exc: PlanCacheError) -> None:
    for text in (exc.detail, str(exc)):
        assert len(text) <= MAX_DETAIL, len(text)
        assert text.splitlines() == [text]
        assert not any(unicodedata.category(c) in {"Cc", "Cf", "Cs", "Zl", "Zp"} for c in text), (
            ascii(text)
        )
        text.encode("utf-8")


def raised(func, *args) -> PlanCacheError:
    with pytest.raises(PlanCacheError) as info:
        func(*args)
    return info.value


def envelope(
    signer: Ed25519Signer, payload: bytes, keyids: list[str], payload_type: str = dsse.PAYLOAD_TYPE
) -> bytes:
    sig = signer.sign(dsse.pae(payload_type, payload))
    return dsse.encode(
        dsse.Envelope(payload_type, payload, tuple(dsse.Signature(k, sig) for k in keyids))
    )


def statement_payload(**changes: object) -> bytes:
    data = plan_bytes()
    statement = Statement(NAME, hashlib.sha256(data).hexdigest(), FP, NOW)
    obj = json.loads(statement.to_json_bytes())
    for key, value in changes.items():
        obj["predicate"][key] = value
    return json.dumps(obj).encode()


@pytest.mark.parametrize("keyid", [FORGED, "\ud800", "\u202e" + "A" * 3000, "\x1b]0;owned\x07", ""])
def test_untrusted_keyids_in_details(keyid: str) -> None:
    signer = make_signer()
    sig = envelope(signer, statement_payload(), [keyid] * 16)
    assert_safe(raised(verify_plan, NAME, plan_bytes(), sig, keyring_of(make_signer()), NOW))


def test_revoked_detail_with_hostile_neighbours() -> None:
    signer = make_signer()
    sig = envelope(signer, statement_payload(), [signer.keyid, FORGED, "\udfff"])
    keyring = Keyring(revoked=frozenset({signer.keyid}))
    assert_safe(raised(verify_plan, NAME, plan_bytes(), sig, keyring, NOW))


def test_hostile_payload_type_and_subject_name() -> None:
    signer = make_signer()
    odd_type = "x\u2028" * 3000
    assert_safe(
        raised(
            verify_plan,
            NAME,
            plan_bytes(),
            envelope(signer, b"{}", [signer.keyid], odd_type),
            keyring_of(signer),
            NOW,
        )
    )
    data = plan_bytes()
    long_name = "startup_plan_" + "\n" * 5000
    payload = Statement(long_name, hashlib.sha256(data).hexdigest(), FP, NOW).to_json_bytes()
    sig = envelope(signer, payload, [signer.keyid])
    assert_safe(raised(verify_plan, NAME, data, sig, keyring_of(signer), NOW))


def test_hostile_provenance_keys_and_plan_values() -> None:
    assert_safe(raised(parse_statement, statement_payload(provenance={"\u202e" * 4000: 1})))
    assert_safe(raised(parse_plan, json.dumps({"schema": "\u2029" * 8000}).encode(), NAME))
    assert_safe(raised(parse_plan, plan_bytes(), "startup_plan_\x1b[2J" + "x" * 3000 + ".json"))
    too_big = {
        "schema": 1,
        "fingerprint": FP,
        "kv_cache_memory_bytes": 10**4000,
        "free_memory_baseline": 1,
    }
    assert_safe(raised(parse_plan, json.dumps(too_big).encode(), NAME))


def test_trusted_keys_file_names_and_lines() -> None:
    assert_safe(raised(parse_trusted_keys, "ssh-ed25519 AAAA\n", "keys.d/evil\nname\ud800.pub"))
    assert_safe(
        raised(
            parse_trusted_keys, "colour=\u202e\x1b[31m" + "x" * 4000 + " ssh-ed25519 AAAA\n", "k"
        )
    )
    assert_safe(raised(parse_trusted_keys, "ssh-" + "\x85" * 4000 + " AAAA\n", "k"))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(exclude_categories=())), min_size=1, max_size=16))
def test_fuzz_keyids_never_reach_a_detail_raw(keyids: list[str]) -> None:
    signer = make_signer()
    sig = envelope(signer, statement_payload(), keyids)
    assert_safe(raised(verify_plan, NAME, plan_bytes(), sig, keyring_of(make_signer()), NOW))
