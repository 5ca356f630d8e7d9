"""Whole-store work streams: the resolver, the audit and prune hold a batch, not the store."""

from __future__ import annotations

from pathlib import Path

from conftest import make_signer, plan_bytes
from plancache.pipeline.audit import audit_store
from plancache.pipeline.resolver import Resolver, utcnow
from plancache.storage.local.localdir import LocalPlanDir
from plancache.storage.store import open_store
from plancache.trust.keyring.keys import Keyring, TrustedKey
from plancache.trust.plans.plan import plan_name
from plancache.trust.policy import TrustPolicy
from plancache.trust.signing import sign_plan

PLANS = 300


def _store_of_signed(tmp_path: Path):
    signer = make_signer()
    bucket = LocalPlanDir(tmp_path / "bucket")
    for i in range(PLANS):
        fp = f"{i:016x}"
        bucket.write(
            fp,
            plan_bytes(fp),
            sign_plan(plan_name(fp), plan_bytes(fp), signer, utcnow()),
            sync=False,
        )
    policy = TrustPolicy.signed(
        Keyring({signer.keyid: TrustedKey(signer.keyid, "ci", signer.public)})
    )
    return open_store(bucket.path.as_uri(), timeout=30), policy


def test_a_whole_store_pull_yields_while_the_store_is_still_being_read(tmp_path: Path) -> None:
    store, policy = _store_of_signed(tmp_path)
    fetched = []
    pulled = Resolver(LocalPlanDir(tmp_path / "cache"), policy, store).pull(
        None, None, fetched.append
    )
    first = next(pulled)
    assert first.verified is not None and first.written
    assert sum(fetched) < PLANS // 2  # the first plan is written long before the last is fetched
    rest = list(pulled)
    assert len(rest) == PLANS - 1 and all(r.written for r in rest) and sum(fetched) == PLANS
    assert len(list((tmp_path / "cache").iterdir())) == 2 * PLANS


def test_a_store_audit_keeps_reports_not_plans(tmp_path: Path) -> None:
    store, policy = _store_of_signed(tmp_path)
    reports = audit_store(store, None, policy, utcnow(), jobs=1)
    assert len(reports) == PLANS and all(r.ok for r in reports)
    assert not any(hasattr(r, "plan_bytes") for r in reports)
