"""A registry that answers 403 for what the reader may not see, and one whose token service hands
out tokens it then refuses (issue 37's edges, item 5).

Least-privilege registry credentials (ECR or GAR with pull-only scope) answer ``403 DENIED`` for a
tag that does not exist, as S3 answers ``403 AccessDenied`` for a missing key to a reader without
``ListBucket``. The registry store must come to what the S3 store comes to
(pipeline/plan_sets/node_plans.py, tests/test_plan_sets_node.py): a plan set (or replica) that
answers 403 is as no set, and the node reads the per-plan objects within the same deadline; a
per-plan object that answers 403 is that plan's ``store-error`` (nobody can tell absent from
denied), with the registry's code in the detail, and ``pull`` exits 2. Behind a bearer token
service, with docker credentials that must never show. And a token service that hands out tokens
the registry refuses forever: a bounded number of requests, one line.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from cli_support import run
from conftest import NOW, plan_bytes
from plancache.clock import Deadline
from plancache.keys.keyfile import generate_keypair, load_keyring
from plancache.keys.schemes import load_signer
from plancache.pipeline.plan_sets.node_plans import resolve_node
from plancache.pipeline.resolver import Resolver
from plancache.storage.local.localdir import LocalPlanDir
from plancache.storage.store import open_store
from plancache.trust.plans.plan import plan_name, sig_name
from plancache.trust.plans.plan_set_names import set_name
from plancache.trust.policy import TrustPolicy
from plancache.trust.result import PlanResult
from plancache.trust.signing import sign_plan
from registry_stub import RegistryStub

REPO = "team/plans"
WORLD = [f"{0x50_0000 + r:016x}" for r in range(4)]
MISSING = "5f5f5f5f5f5f5f5f"
USER, PASSWORD = "puller", "pw-4711-do-not-show"
AUTH = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
BUDGET = 30.0
"""Generous: these tests count requests and read outcomes, they do not time anything."""


@pytest.fixture
def stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RegistryStub]:
    """The stub behind a bearer token service, docker credentials for it in DOCKER_CONFIG."""
    server = RegistryStub()
    server.state.bearer = AUTH
    config = tmp_path / "docker" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"auths": {server.host: {"auth": AUTH}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config.parent))
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    yield server
    server.stop()


@pytest.fixture
def key(tmp_path: Path) -> Path:
    generate_keypair(tmp_path / "ci", force=False, comment="ci")
    return tmp_path / "ci"


def push_plans(stub: RegistryStub, key: Path, fps: list[str]) -> None:
    """The world's per-plan objects, signed, and no plan set (a store pushed plan by plan)."""
    signer = load_signer(str(key))
    objects = {}
    for rank, fp in enumerate(fps):
        data = plan_bytes(fp=fp)
        objects[plan_name(fp)] = data
        objects[sig_name(fp)] = sign_plan(
            plan_name(fp),
            data,
            signer,
            NOW - timedelta(hours=1),
            provenance={"rank": rank, "world_size": len(WORLD)},
        )
    open_store(stub.url(REPO), {}, BUDGET).put_many(objects)


def manifest_requests(stub: RegistryStub, fp_or_name: str) -> int:
    return sum(
        1
        for m, p, _ in stub.state.requests
        if "/manifests/" in p and fp_or_name in p and m == "GET"
    )


def assert_no_secret(text: str) -> None:
    for secret in (PASSWORD, AUTH, "stub-token", "useless-token"):
        assert secret not in text


def test_pull_of_a_tag_the_registry_denies_is_that_plans_store_error(
    capsys: pytest.CaptureFixture[str], stub: RegistryStub, key: Path, tmp_path: Path
) -> None:
    push_plans(stub, key, WORLD)
    stub.state.missing_status = 403
    dest = tmp_path / "dest"
    trust = ("--trusted-keys", f"{key}.pub", "--timeout", "10", "--json")
    code, out, err = run(
        capsys, "pull", *trust, "--fingerprint", MISSING, stub.url(REPO), str(dest)
    )
    (plan,) = json.loads(out)["plans"]
    assert code == 2 and plan["reason"] == "store-error", out + err  # as S3's AccessDenied
    assert (
        "403" in plan["detail"] and "DENIED" in plan["detail"] and "access denied" in plan["detail"]
    )
    assert "\n" not in plan["detail"] and "Traceback" not in err
    assert_no_secret(out + err)
    assert manifest_requests(stub, MISSING) <= 2  # asked once (and once more after the 401)
    assert not dest.exists() or list(dest.iterdir()) == []

    code, out, err = run(
        capsys, "pull", *trust, "--fingerprint", WORLD[1], stub.url(REPO), str(dest)
    )
    assert code == 0, out + err  # what the reader may see is read as ever
    assert LocalPlanDir(dest).fingerprints() == [WORLD[1]]


def _boot(
    stub: RegistryStub, key: Path, directory: LocalPlanDir, fp: str, replica: int = 0
) -> PlanResult:
    keyring = load_keyring(Path(f"{key}.pub"))
    store = open_store(stub.url(REPO), {}, BUDGET)
    resolver = Resolver(directory, TrustPolicy.signed(keyring), store, clock=lambda: NOW)
    return resolve_node(resolver, fp, WORLD, Deadline.after(BUDGET), replica=replica)


@pytest.mark.parametrize("replica", [0, 2])
def test_a_denied_plan_set_is_as_no_set_on_the_boot_path(
    stub: RegistryStub, key: Path, tmp_path: Path, replica: int
) -> None:
    """No set was pushed, the registry answers 403 for its tag (and its replica's): every rank's
    plan is still read from the per-plan objects, as from S3 (test_plan_sets_node.py)."""
    push_plans(stub, key, WORLD)
    stub.state.missing_status = 403
    directory = LocalPlanDir(tmp_path / "vllm" / "startup_plan")
    result = _boot(stub, key, directory, WORLD[2], replica)
    assert result.verified is not None and result.error is None, result
    note = result.note
    assert "plan set unread (store-error" in note and "access denied" in note, note
    assert directory.fingerprints() == sorted(WORLD)
    assert manifest_requests(stub, set_name(WORLD).rsplit(".", 1)[0]) >= 1
    assert_no_secret(note)


def test_a_rank_whose_plan_is_denied_profiles_with_store_error_the_others_apply(
    stub: RegistryStub, key: Path, tmp_path: Path
) -> None:
    push_plans(stub, key, WORLD[:3])  # rank 3's plan was never pushed: its tag answers 403
    stub.state.missing_status = 403
    directory = LocalPlanDir(tmp_path / "vllm" / "startup_plan")
    result = _boot(stub, key, directory, WORLD[3])
    assert result.verified is None and result.error is not None, result
    assert result.error.reason.value == "store-error"
    assert "access denied" in result.error.detail
    assert directory.fingerprints() == sorted(WORLD[:3])  # the other ranks' plans were written
    assert_no_secret(result.error.detail)


def test_a_token_service_whose_tokens_are_refused_is_bounded_and_one_line(
    capsys: pytest.CaptureFixture[str], stub: RegistryStub, key: Path, tmp_path: Path
) -> None:
    push_plans(stub, key, WORLD)
    stub.state.issued_token = "useless-token"  # the registry wants stub-token: 401 forever
    stub.state.requests.clear()
    dest = tmp_path / "dest"
    trust = ("--trusted-keys", f"{key}.pub", "--timeout", "10")
    code, out, err = run(
        capsys, "pull", *trust, "--fingerprint", WORLD[0], stub.url(REPO), str(dest)
    )
    assert code == 2 and "refused the credentials" in out, out + err
    rows = [line for line in out.splitlines() if WORLD[0] in line]
    assert len(rows) == 1 and "Traceback" not in err
    assert_no_secret(out + err)
    tokens = [p for _, p, _ in stub.state.requests if p.startswith("/token")]
    assert 1 <= len(tokens) <= 2 and manifest_requests(stub, WORLD[0]) <= 2
    code, out, err = run(capsys, "ls", stub.url(REPO))
    assert code == 2 and "refused the credentials" in out + err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert_no_secret(out + err)
