"""Fixtures shared by the whole suite: keys, plans written as vLLM writes them, a clock."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from plancache.trust.keys import Ed25519Signer, Keyring, TrustedKey
from plancache.trust.plan import Plan, plan_name, render_plan
from plancache.trust.result import PlanResult
from plancache.trust.signing import sign_plan

FP = "0123456789abcdef"
GIB = 2**30
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=timezone.utc)


def make_signer() -> Ed25519Signer:
    return Ed25519Signer(Ed25519PrivateKey.generate())


def keyring_of(*signers: Ed25519Signer, threshold: int = 1, **windows: datetime) -> Keyring:
    keys = {
        s.keyid: TrustedKey(s.keyid, f"key{i}", s.public, windows.get("valid_after"), windows.get("valid_before"))
        for i, s in enumerate(signers)
    }
    return Keyring(keys, frozenset(), threshold)


def raw(result: "PlanResult") -> tuple[bytes | None, bytes | None]:
    """A store's result as (plan bytes, sidecar bytes); its error raised, as a caller would see it."""
    if result.error is not None:
        raise result.error
    return result.plan_bytes, result.sig_bytes


def plan_bytes(fp: str = FP, kv: int = 20 * GIB, baseline: int = 70 * GIB) -> bytes:
    return render_plan(Plan(fp, kv, baseline))


@pytest.fixture
def signer() -> Ed25519Signer:
    return make_signer()


@pytest.fixture
def signed(signer: Ed25519Signer) -> tuple[str, bytes, bytes]:
    """(name, plan bytes, sidecar bytes) for plan FP signed at NOW by ``signer``."""
    data = plan_bytes()
    return plan_name(FP), data, sign_plan(plan_name(FP), data, signer, NOW, NOW + timedelta(days=30))


@pytest.fixture
def plan_dir(tmp_path: Path) -> Path:
    path = tmp_path / "vllm" / "startup_plan"
    path.mkdir(parents=True)
    return path


WriteSigned = Callable[..., tuple[bytes, bytes]]
