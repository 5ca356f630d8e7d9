"""Signed inputs (issue 20): statements and manifests made the old way still verify; new fields are
bounded, checked before they are signed, and never carry a secret in the clear. No vLLM."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from conftest import NOW, keyring_of, make_signer, plan_bytes
from plancache.trust import envelope as dsse
from plancache.trust.compile_cache.manifest import Manifest, parse_manifest
from plancache.trust.compile_cache.manifest_signature import sign_manifest, verify_manifest
from plancache.trust.errors import ConfigError, Rejected
from plancache.trust.inputs import check_inputs, differences, fingerprint_of_inputs, without_secrets
from plancache.trust.plans.plan import plan_name
from plancache.trust.signing import sign_plan
from plancache.trust.verify import verify_plan

SIGNER = make_signer()
KEYRING = keyring_of(SIGNER)
INPUTS = {
    "schema": 1,
    "vllm": "0.33.0",
    "vllm_config": "abcdef0123",
    "device_name": "NVIDIA H100 80GB HBM3",
    "device_total_memory": 85899345920,
    "device_capability": "9.0",
    "torch": "2.14.0",
    "cuda": "12.8",
    "rank": 0,
    "world_size": 1,
}
FP = fingerprint_of_inputs(INPUTS)


def _old_sidecar(fp: str, data: bytes) -> bytes:
    """A sidecar exactly as plancache wrote it before issue 20 (no inputs, no measurements)."""
    statement = {
        "_type": "https://in-toto.io/Statement/v1",
        "predicateType": "https://plancache.dev/startup-plan/v1",
        "subject": [
            {"name": plan_name(fp), "digest": {"sha256": hashlib.sha256(data).hexdigest()}}
        ],
        "predicate": {
            "fingerprint": fp,
            "signed_at": "2026-11-29T11:00:00Z",
            "expires_at": None,
            "comment": "",
            "provenance": {"gpu_memory_utilization": 0.9},
        },
    }
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    sig = dsse.Signature(SIGNER.keyid, SIGNER.sign(dsse.pae(dsse.PAYLOAD_TYPE, payload)))
    return dsse.encode(dsse.Envelope(dsse.PAYLOAD_TYPE, payload, (sig,)))


def test_vllms_digest_of_its_factors_is_the_fingerprint() -> None:
    assert hashlib.sha256(json.dumps(INPUTS, sort_keys=True).encode()).hexdigest()[:16] == FP


def test_an_old_statement_still_verifies_and_a_new_one_carries_the_inputs() -> None:
    data = plan_bytes(FP)
    old = verify_plan(plan_name(FP), data, _old_sidecar(FP, data), KEYRING, NOW)
    assert old.statement is not None and not old.statement.inputs and not old.statement.measurements
    new = sign_plan(
        plan_name(FP),
        data,
        SIGNER,
        NOW,
        inputs=INPUTS,
        measurements={"profile_ms": 1500.0},
        config_parts={"model_config": "a" * 16},
    )
    statement = verify_plan(plan_name(FP), data, new, KEYRING, NOW).statement
    assert statement is not None and dict(statement.inputs) == INPUTS
    assert statement.measurements == {"profile_ms": 1500.0} and statement.config_parts == {
        "model_config": "a" * 16
    }
    # without inputs, the statement is byte-for-byte the old form (no new predicate keys)
    plain = json.loads(dsse.decode(sign_plan(plan_name(FP), data, SIGNER, NOW)).payload)
    assert set(plain["predicate"]) == {
        "fingerprint",
        "signed_at",
        "expires_at",
        "comment",
        "provenance",
    }


def test_inputs_that_do_not_reproduce_the_fingerprint_are_never_signed() -> None:
    with pytest.raises(ConfigError, match="hash to"):
        sign_plan(plan_name(FP), plan_bytes(FP), SIGNER, NOW, inputs={**INPUTS, "vllm": "0.33.1"})
    with pytest.raises(ConfigError, match="measurement"):
        sign_plan(plan_name(FP), plan_bytes(FP), SIGNER, NOW, measurements={"profile_ms": -1})


@pytest.mark.parametrize(
    "bad",
    [
        {"a": float("nan")},
        {"bad name!": 1},
        {"a": "x" * 2000},
        {"a": {"b": {"c": {"d": 1}}}},
        {f"k{i}": i for i in range(600)},
        {"a": object()},
    ],
    ids=["nan", "name", "long", "deep", "many", "object"],
)
def test_inputs_are_bounded_json(bad: dict) -> None:
    with pytest.raises(Rejected):
        check_inputs(bad)


def test_secrets_are_hashed_once_and_counts_stay_readable() -> None:
    env = {
        "VLLM_API_KEY": "s3cr3t",
        "HF_TOKEN": "hf_abc",
        "MY_SECRET_THING": "x",
        "VLLM_MAX_TOKENS": 7,
        "VLLM_X_TOKEN_THRESHOLD": 3,
        "VLLM_PLUGINS": "plancache",
    }
    once = without_secrets({"env": env})
    assert "s3cr3t" not in json.dumps(once) and "hf_abc" not in json.dumps(once)
    assert once["env"]["VLLM_MAX_TOKENS"] == 7 and once["env"]["VLLM_X_TOKEN_THRESHOLD"] == 3
    assert once["env"]["VLLM_PLUGINS"] == "plancache" and once["env"]["HF_TOKEN"].startswith(
        "sha256:"
    )
    assert without_secrets(once) == once  # hashing twice would make two equal values differ
    assert differences({"env": {"A": 1}, "x": 2}, {"env": {"A": 2}, "x": 2}) == [
        {"input": "env.A", "signed": 1, "here": 2}
    ]


def _manifest(**extra: Any) -> Manifest:
    return Manifest("0123456789", (), ("rank_0_0",), "a" * 64, 512, NOW, None, "", **extra)


def test_an_old_manifest_still_verifies_and_a_new_one_carries_the_factors() -> None:
    old = sign_manifest(_manifest(), SIGNER)
    assert set(json.loads(dsse.decode(old).payload)["predicate"]) == {
        "archive",
        "comment",
        "dirs",
        "expires_at",
        "files",
        "signed_at",
    }
    assert verify_manifest("0123456789", old, KEYRING, NOW).manifest.key_factors is None
    factors = {
        "env": {"VLLM_PLUGINS": None},
        "config_hash": "abc",
        "code_hash": "c" * 64,
        "compiler_hash": "d" * 64,
    }
    new = sign_manifest(
        _manifest(key_factors=factors, measurements={"compile_ms": 20000.0}), SIGNER
    )
    verified = verify_manifest("0123456789", new, KEYRING, NOW).manifest
    assert verified.key_factors == factors and verified.measurements == {"compile_ms": 20000.0}
    payload = json.loads(dsse.decode(new).payload)
    payload["predicate"]["unknown"] = 1  # still a closed set of keys
    with pytest.raises(Rejected):
        parse_manifest(json.dumps(payload).encode())
