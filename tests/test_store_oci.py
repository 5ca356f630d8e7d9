"""OCI registries as stores: round trips through Debian's docker-registry on 127.0.0.1.

The layout (one manifest per object, found by tag, a small plan and its signature inside it),
what each read costs in requests, the CLI's commands on ``oci://``, prune's deletes by digest,
and how a registry URL is told from an Oracle Cloud (ocifs) one.
"""

from __future__ import annotations

import base64
import gc
import json
import re
import warnings
from pathlib import Path

import pytest

from conftest import FP, plan_bytes
from plancache.cli.main import main
from plancache.keys.keyfile import generate_keypair
from plancache.storage.local.localdir import LocalPlanDir
from plancache.storage.oci.artifacts import EMPTY_DIGEST
from plancache.storage.oci.registry_urls import is_registry_url, parse_store_url
from plancache.storage.store import open_store
from plancache.trust.errors import ConfigError
from plancache.trust.plans.plan import plan_name, sig_name
from registry_server import DockerRegistry
from store_servers import (
    registry,  # noqa: F401 - a fixture, named as a parameter
)

FP2 = "fedcba9876543210"


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    generate_keypair(tmp_path / "ci", force=False, comment="ci")
    return tmp_path / "ci"


def push_two(keys: Path, tmp_path: Path, url: str, *extra: str) -> None:
    plans = LocalPlanDir(tmp_path / "ci-plans")
    plans.write(FP, plan_bytes(), None)
    plans.write(FP2, plan_bytes(FP2), None)
    assert main(["push", "--key", str(keys), str(tmp_path / "ci-plans"), url, *extra]) == 0


def test_urls_tell_a_registry_from_oracle_object_storage() -> None:
    assert is_registry_url("oci://registry.example:5000/team/plans")
    assert not is_registry_url("oci://bucket@namespace/prefix")
    assert parse_store_url("oci://127.0.0.1:5000/a/b")[1] == "a/b"
    for bad in ("oci://reg/Upper", "oci://reg", "oci://reg/app:v1", "oci://reg/a?x=1"):
        with pytest.raises(ConfigError):
            parse_store_url(bad)


def test_cli_round_trip_and_layout(
    registry: DockerRegistry, keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = registry.new_repository()
    url = registry.url(repo)
    push_two(keys, tmp_path, url)
    assert main(["verify", "--trusted-keys", f"{keys}.pub", url]) == 0
    assert main(["ls", "--json", url]) == 0
    listed = capsys.readouterr().out
    assert FP in listed and FP2 in listed
    status, body = registry.get(f"/v2/{repo}/manifests/{plan_name(FP)}")
    manifest = json.loads(body)
    assert status == 200
    assert manifest["artifactType"] == "application/vnd.plancache.plan.v1"
    plan_layer, sig_layer = manifest["layers"]
    assert plan_layer["mediaType"] == "application/vnd.plancache.plan.v1+json"
    assert sig_layer["mediaType"] == "application/vnd.dsse.envelope.v1+json" and sig_layer["data"]
    assert base64.b64decode(plan_layer["data"]) == plan_bytes()  # small content rides inline
    before = len(registry.settled_requests())
    code = main(
        [
            "pull",
            "--trusted-keys",
            f"{keys}.pub",
            "--fingerprint",
            FP,
            url,
            str(tmp_path / "spot"),
            "--timeout",
            "30",
        ]
    )
    assert code == 0, capsys.readouterr()
    assert (tmp_path / "spot" / plan_name(FP)).read_bytes() == plan_bytes()
    reads = registry.settled_requests()[before:]
    plan_reads = [r for r in reads if plan_name(FP) in r[1] or "/blobs/" in r[1]]
    assert [m for m, _ in plan_reads] == ["GET"], reads  # one manifest: the plan is in it


def test_a_push_to_a_new_repository_uploads_each_blob_once(
    registry: DockerRegistry, keys: Path, tmp_path: Path
) -> None:
    """Twenty plans pushed at once to new repositories: each manifest names the empty config,
    and its uploads, racing each other, made the registry refuse a manifest PUT meanwhile (400
    MANIFEST_BLOB_UNKNOWN) in about half the pushes of nine plans. One upload of it a push, and
    every push succeeds."""
    plans = LocalPlanDir(tmp_path / "ci-plans")
    for i in range(20):
        plans.write(f"{i:016x}", plan_bytes(f"{i:016x}"), None)
    assert main(["sign", "--key", str(keys), str(plans.path)]) == 0
    config = re.escape(f"digest={EMPTY_DIGEST}")
    for _ in range(3):
        url = registry.url(registry.new_repository("race"))
        before = len(registry.settled_requests(config))
        assert main(["push", str(plans.path), url]) == 0
        assert len(registry.settled_requests(config)) - before == 1


def test_store_objects_round_trip_and_delete_by_digest(registry: DockerRegistry) -> None:
    repo = registry.new_repository()
    store = open_store(registry.url(repo), timeout=30)
    store.put_many({plan_name(FP): b"plan-bytes", sig_name(FP): b"sig-bytes"})
    got = store.fetch(FP)
    assert (got.plan_bytes, got.sig_bytes) == (b"plan-bytes", b"sig-bytes")
    assert store.fingerprints() == [FP]
    store.put_many({sig_name(FP): b"sig-2"})  # a co-signature replaces the sidecar only
    got = store.fetch(FP)
    assert (got.plan_bytes, got.sig_bytes) == (b"plan-bytes", b"sig-2")
    store.delete([FP])
    assert store.fetch(FP).plan_bytes is None
    assert store.fingerprints() == []
    assert registry.get(f"/v2/{repo}/manifests/{plan_name(FP)}")[0] == 404


def test_a_store_let_go_closes_its_session_on_its_own_loop(registry: DockerRegistry) -> None:
    """Collected, a store's HTTP session is closed (aiohttp's ``close()``, on the loop that owns
    its connections), with no 'Unclosed' warning."""
    store = open_store(registry.url(registry.new_repository()), timeout=30)
    store.put_many({plan_name(FP): b"plan-bytes"})
    session = store.backend.origin._session
    assert session is not None and not session.closed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del store
        gc.collect()
    assert session.closed
    assert not [w for w in caught if "nclosed" in str(w.message)]
