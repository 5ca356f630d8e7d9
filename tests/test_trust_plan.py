"""The strict schema-1 plan parser: everything vLLM would swallow that plancache refuses."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FP, GIB, plan_bytes
from plancache.trust.errors import PlanCacheError, Reason
from plancache.trust.plans.plan import (
    MAX_INT,
    MAX_PLAN_BYTES,
    Plan,
    fingerprint_of_plan_name,
    fingerprint_of_sig_name,
    parse_plan,
    plan_name,
    render_plan,
)

NAME = plan_name(FP)


def obj(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "schema": 1,
        "fingerprint": FP,
        "kv_cache_memory_bytes": 10,
        "free_memory_baseline": 20,
    }
    base.update(changes)
    return {k: v for k, v in base.items() if v is not ...}


def reject(data: bytes, reason: Reason = Reason.MALFORMED, name: str = NAME) -> PlanCacheError:
    with pytest.raises(PlanCacheError) as info:
        parse_plan(data, name)
    assert info.value.reason is reason, info.value
    return info.value


def test_round_trip_keeps_unknown_fields() -> None:
    data = json.dumps(obj(created_unix=1764000000.5, note={"a": [1, 2]})).encode()
    plan = parse_plan(data, NAME)
    assert (plan.kv_cache_memory_bytes, plan.free_memory_baseline) == (10, 20)
    assert plan.extra == {"created_unix": 1764000000.5, "note": {"a": [1, 2]}}
    assert parse_plan(render_plan(plan), NAME) == plan


@pytest.mark.parametrize(
    "document",
    [
        "[]",
        '"plan"',
        "null",
        json.dumps(obj(schema=2)),
        json.dumps(obj(schema=True)),
        json.dumps(obj(schema=...)),
        json.dumps(obj(fingerprint=...)),
        json.dumps(obj(fingerprint="0123456789ABCDEF")),
        json.dumps(obj(fingerprint="0123456789abcde")),
        json.dumps(obj(fingerprint=12345678)),
        json.dumps(obj(kv_cache_memory_bytes=...)),
        json.dumps(obj(free_memory_baseline=...)),
        json.dumps(obj(kv_cache_memory_bytes=True)),
        json.dumps(obj(free_memory_baseline=True)),
        json.dumps(obj(kv_cache_memory_bytes=10.0)),
        json.dumps(obj(kv_cache_memory_bytes="10")),
        json.dumps(obj(kv_cache_memory_bytes=0)),
        json.dumps(obj(kv_cache_memory_bytes=-1)),
        json.dumps(obj(free_memory_baseline=0)),
        json.dumps(obj(kv_cache_memory_bytes=21)),
        json.dumps(obj(kv_cache_memory_bytes=2**63, free_memory_baseline=2**64)),
        '{"schema": 1, "schema": 1, "fingerprint": "' + FP + '", "kv_cache_memory_bytes": 1, '
        '"free_memory_baseline": 2}',
        '{"schema": 1, "fingerprint": "' + FP + '", "kv_cache_memory_bytes": 1, '
        '"free_memory_baseline": 2, "x": NaN}',
        '{"schema": 1, "fingerprint": "' + FP + '", "kv_cache_memory_bytes": 1, '
        '"free_memory_baseline": Infinity}',
        "{" * 100_000,
        "1" * 5000,
        '{"schema": 1',
    ],
)
def test_rejects_malformed(document: str) -> None:
    reject(document.encode()[:MAX_PLAN_BYTES])


def test_rejects_invalid_utf8() -> None:
    reject(b'{"schema": 1, "fingerprint": "\xff"}')


def test_rejects_fingerprint_other_than_file_name() -> None:
    reject(plan_bytes(fp="fedcba9876543210"), Reason.FINGERPRINT_MISMATCH)


@pytest.mark.parametrize(
    "name",
    ["plan.json", "startup_plan_0123456789abcdef.json\n", "../startup_plan_0123456789abcdef.json"],
)
def test_rejects_bad_file_names(name: str) -> None:
    reject(plan_bytes(), name=name)


def test_rejects_oversized_before_parsing() -> None:
    padded = json.dumps(obj(pad="x" * MAX_PLAN_BYTES)).encode()
    reject(padded, Reason.TOO_LARGE)


def test_names() -> None:
    assert fingerprint_of_plan_name(NAME) == FP
    assert fingerprint_of_sig_name(NAME + ".sig") == FP
    assert fingerprint_of_plan_name(NAME + ".sig") is None
    assert fingerprint_of_plan_name(NAME + "\n") is None
    assert fingerprint_of_plan_name("x" + NAME) is None
    with pytest.raises(PlanCacheError):
        plan_name("../../etc/passwd")


def test_plan_bytes_helper_is_vllm_shaped() -> None:
    plan = parse_plan(plan_bytes(kv=3 * GIB, baseline=4 * GIB), NAME)
    assert plan == Plan(FP, 3 * GIB, 4 * GIB)


_extras = st.dictionaries(
    st.text(max_size=12).filter(
        lambda k: (
            k not in {"schema", "fingerprint", "kv_cache_memory_bytes", "free_memory_baseline"}
        )
    ),
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=12),
        lambda children: (
            st.lists(children, max_size=3)
            | st.dictionaries(st.text(max_size=8), children, max_size=3)
        ),
        max_leaves=10,
    ),
    max_size=4,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, MAX_INT), st.integers(1, MAX_INT), _extras)
def test_every_valid_plan_survives_render_and_parse(
    a: int, b: int, extra: dict[str, object]
) -> None:
    """What plancache writes (the demo, tests, the plugin's re-render) the strict parser takes
    back unchanged. Byte equality with vLLM's own writer is checked against the real vLLM in
    tests/test_vllm_plugin.py::test_plan_bytes_are_exactly_what_vllm_writes."""
    plan = Plan(FP, min(a, b), max(a, b), extra)
    data = render_plan(plan)
    assert parse_plan(data, NAME) == plan
    assert render_plan(parse_plan(data, NAME)) == data
