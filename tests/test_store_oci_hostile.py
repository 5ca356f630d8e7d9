"""A registry that lies, floods or stalls: every answer bounded, one clear line, nothing written.

The misbehaving registry is tests/registry_stub.py (docker-registry cannot be made to lie);
the black hole is store_servers.BlackHole. Budgets are asserted with a generous slack.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import FP, plan_bytes, raw
from plancache.cli.main import main
from plancache.keys.keyfile import generate_keypair
from plancache.storage.local.localdir import LocalPlanDir
from plancache.storage.oci.artifacts import MAX_EMBEDDED
from plancache.storage.plan_set_objects import read_set
from plancache.storage.store import Store, open_store
from plancache.trust.errors import PlanCacheError, Reason
from plancache.trust.plans.plan import plan_name
from plancache.trust.plans.plan_set import set_name
from registry_stub import RegistryStub
from store_servers import (
    BlackHole,
    black_hole,  # noqa: F401 - a fixture, named as a parameter
    nothing_written,
    pull_fingerprint,
)

SLACK = 2.0
REPO = "plancache/hostile"


@pytest.fixture
def stub() -> Iterator[RegistryStub]:
    server = RegistryStub()
    yield server
    server.stop()


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    generate_keypair(tmp_path / "ci", force=False, comment="ci")
    return tmp_path / "ci"


def pushed(stub: RegistryStub, keys: Path, tmp_path: Path) -> str:
    url = stub.url(REPO)
    LocalPlanDir(tmp_path / "ci-plans").write(FP, plan_bytes(), None)
    assert main(["push", "--key", str(keys), str(tmp_path / "ci-plans"), url]) == 0
    return url


def pull(
    capsys: pytest.CaptureFixture[str], url: str, keys: Path, dest: Path
) -> tuple[int, str, str, float]:
    capsys.readouterr()
    return pull_fingerprint(capsys, url, "read_timeout=2", keys, dest)


@pytest.mark.parametrize(
    ("target", "mode", "code", "reason"),
    [
        (plan_name(FP), "other-bytes", 1, "digest-mismatch"),
        (plan_name(FP), "wrong-type", 1, "malformed"),
        (plan_name(FP), "oversized", 1, "too-large"),
        (plan_name(FP), "endless", 1, "too-large"),
    ],
)
def test_a_lying_registry_is_one_line_and_nothing_is_written(
    stub: RegistryStub,
    keys: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    target: str,
    mode: str,
    code: int,
    reason: str,
) -> None:
    url = pushed(stub, keys, tmp_path)
    stub.state.faults[target] = mode
    got, out, err, elapsed = pull(capsys, url, keys, tmp_path / "d")
    assert got == code and reason in out, (out, err)
    assert elapsed < 3.0 + SLACK
    assert "Traceback" not in err
    assert nothing_written(tmp_path / "d")


SET = set_name([FP, "fedcba9876543210"])
LARGE = bytes(range(256)) * 300
"""Past what rides inside a manifest (MAX_EMBEDDED): a blob of its own, read by digest."""


def large_object(stub: RegistryStub) -> tuple[Store, str]:
    """A store holding a plan set too large to ride inline, and its blob's digest."""
    assert len(LARGE) > MAX_EMBEDDED
    store = open_store(stub.url(REPO), {"read_timeout": 2}, timeout=5)
    store.put_many({SET: LARGE})
    return store, next(d for d, b in stub.state.blobs.items() if b == LARGE)


def test_a_blob_of_other_bytes_is_a_digest_mismatch(stub: RegistryStub) -> None:
    store, blob = large_object(stub)
    assert read_set(store, SET) == LARGE
    stub.state.faults[blob] = "other-bytes"
    with pytest.raises(PlanCacheError) as err:
        read_set(store, SET)
    assert err.value.reason is Reason.DIGEST_MISMATCH


def test_a_redirected_blob_is_followed_without_credentials(stub: RegistryStub) -> None:
    store, blob = large_object(stub)
    other = RegistryStub()
    try:
        other.state.blobs.update(stub.state.blobs)
        stub.state.redirect_to = f"http://{other.host}/v2/x/blobs"
        stub.state.faults[blob] = "redirect"
        assert read_set(store, SET) == LARGE
        followed = [h for m, p, h in other.state.requests if blob in p]
        assert followed and all("Authorization" not in h for h in followed)
    finally:
        other.stop()


def test_a_black_hole_ends_at_the_budget(
    black_hole: BlackHole, keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"oci://127.0.0.1:{black_hole.port}/{REPO}"
    started = time.monotonic()
    with pytest.raises(PlanCacheError) as err:
        raw(open_store(url, timeout=1.0).fetch(FP))
    assert err.value.reason is Reason.TIMEOUT and time.monotonic() - started < 1.0 + SLACK
    code, out, _, elapsed = pull(capsys, url, keys, tmp_path / "d")
    assert code == 2 and "timeout" in out and elapsed < 3.0 + SLACK
    assert nothing_written(tmp_path / "d")
