"""The flows beyond one plan on a registry store: prune, plan sets, compile caches.

Against Debian's docker-registry on 127.0.0.1 (tests/registry_server.py): prune deletes by
digest and leaves the tag gone; a set object is one more artifact; a compile cache's archive,
signature and headers travel as their own artifact types and come back verified.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import FP, NOW, keyring_of, make_signer, plan_bytes
from plancache.cli.main import main
from plancache.keys.keyfile import generate_keypair
from plancache.pipeline.compile_cache import flows as cc
from plancache.pipeline.compile_cache.local_caches import CacheRoot, verify_cache
from plancache.storage.compile_cache import archives
from plancache.storage.local.localdir import LocalPlanDir
from plancache.storage.plan_set_objects import read_set, set_names
from plancache.storage.store import open_store
from plancache.trust.plans.plan import plan_name
from registry_server import DockerRegistry
from store_servers import (
    registry,  # noqa: F401 - a fixture, named as a parameter
)

FP2 = "fedcba9876543210"
SUBJECT = "torch_aot_compile/" + "ab" * 32
SIGNER = make_signer()


def test_prune_unsigned_deletes_by_digest_and_keeps_the_rest(
    registry: DockerRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = registry.new_repository()
    url = registry.url(repo)
    generate_keypair(tmp_path / "ci", force=False, comment="ci")
    LocalPlanDir(tmp_path / "ci-plans").write(FP, plan_bytes(), None)
    assert main(["push", "--key", str(tmp_path / "ci"), str(tmp_path / "ci-plans"), url]) == 0
    open_store(url, timeout=30).put_many({plan_name(FP2): plan_bytes(FP2)})  # no signature
    capsys.readouterr()
    assert main(["prune", "--unsigned", "--json", url]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert FP2 in out
    assert registry.get(f"/v2/{repo}/manifests/{plan_name(FP2)}")[0] == 404
    assert registry.get(f"/v2/{repo}/manifests/{plan_name(FP)}")[0] == 200
    deletes = [uri for method, uri in registry.requests(repo) if method == "DELETE"]
    assert deletes and all("/manifests/sha256:" in uri for uri in deletes)  # by digest only


def test_plan_set_objects_are_artifacts_of_their_own(registry: DockerRegistry) -> None:
    repo = registry.new_repository()
    store = open_store(registry.url(repo), timeout=30)
    name = f"startup_planset_{FP}.set"
    store.put_many({name: b'{"set": 1}'})
    assert read_set(store, name) == b'{"set": 1}'
    assert set_names(store) == [name]
    body = json.loads(registry.get(f"/v2/{repo}/manifests/{name}")[1])
    assert body["artifactType"] == "application/vnd.plancache.plan-set.v1"


def test_compile_cache_round_trip(registry: DockerRegistry, tmp_path: Path) -> None:
    d = tmp_path / "vllm" / "torch_compile_cache" / SUBJECT
    (d / "rank_0_0").mkdir(parents=True)
    (d / "rank_0_0" / "model").write_bytes(b"\x80\x04model-pickle" * 100)
    (d / "inductor_cache" / "bn").mkdir(parents=True)
    (d / "inductor_cache" / "bn" / "cbn.py").write_text("x = 1\n")
    root = CacheRoot(tmp_path / "vllm")
    assert cc.sign_cache(root, SUBJECT, SIGNER, NOW).action == "signed"
    repo = registry.new_repository("caches")
    store = open_store(registry.url(repo), timeout=30)
    keyring = keyring_of(SIGNER)
    assert cc.push_cache(store, root, SUBJECT, keyring, NOW).action == "pushed"
    assert archives.list_subjects(store) == [SUBJECT]
    fresh = CacheRoot(tmp_path / "fresh")
    assert cc.pull_cache(store, fresh, SUBJECT, keyring, NOW).action == "pulled"
    assert verify_cache(fresh, SUBJECT, keyring, NOW).action == "verified"
    tag = archives.archive_name(SUBJECT).replace("/", "--")
    body = json.loads(registry.get(f"/v2/{repo}/manifests/{tag}")[1])
    assert body["artifactType"] == "application/vnd.plancache.compile-cache.v1"
    assert [layer["mediaType"] for layer in body["layers"]] == [
        "application/vnd.plancache.compile-cache.v1.tar",
        "application/vnd.dsse.envelope.v1+json",
    ]
