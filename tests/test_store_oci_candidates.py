"""Many candidates for one name attached to an image, on a real registry (docker-registry 2.8).

A co-tenant who may push but holds no key can attach any number of manifests titled like a plan
or a compile cache to the image, each newer than the signed one. Readers take the newest first
(at most ``MAX_CANDIDATES``): a compile cache whose newest candidate fails verification is
pulled from the others, as a plan is; and one ``prune --invalid --subject`` run removes every
candidate that fails, however many there are (more than a reader tries), so the signed plan is
readable again after it, and its report counts what it deleted and kept truthfully.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from conftest import FP, NOW, keyring_of, make_signer, plan_bytes
from plancache.cli.main import main
from plancache.clock import Deadline
from plancache.pipeline.compile_cache import flows as cc
from plancache.pipeline.compile_cache.load import guard
from plancache.pipeline.compile_cache.local_caches import CacheRoot, verify_cache
from plancache.storage.compile_cache import archives, cachedir
from plancache.storage.oci.registry import MAX_CANDIDATES
from plancache.storage.store import Store, open_store
from plancache.trust.plans.plan import plan_name, sig_name
from registry_server import DockerRegistry
from store_servers import (
    registry,  # noqa: F401 - a fixture, named as a parameter
)
from test_store_oci_referrers import push_image
from test_store_oci_slots import (
    DSSE,
    MANIFEST,
    PLAN_TYPE,
    _attach_forgery,
    _layer,
    _tag,
    signed_plans,  # noqa: F401 - a fixture, named as a parameter
)

SUBJECT = "torch_aot_compile/" + "cd" * 32
CACHE_TYPE = "application/vnd.plancache.compile-cache.v1"
TAR_TYPE = CACHE_TYPE + ".tar"


def _bad_signature(sig: bytes) -> bytes:
    """The genuine envelope with its signature's bytes altered: it names the trusted key and
    does not verify."""
    value = json.loads(sig)["signatures"][0]["sig"]
    raw = bytearray(base64.b64decode(value))
    raw[0] ^= 0xFF
    altered = sig.replace(value.encode(), base64.b64encode(bytes(raw)))
    assert altered != sig
    return altered


@pytest.mark.parametrize("forgery", ["bad-signature", "other-archive"])
def test_a_compile_cache_behind_a_candidate_that_fails_is_pulled(
    registry: DockerRegistry, tmp_path: Path, forgery: str
) -> None:
    signer = make_signer()
    d = tmp_path / "vllm" / "torch_compile_cache" / SUBJECT
    (d / "rank_0_0").mkdir(parents=True)
    # over the size a manifest embeds: the archive is a blob, read by digest
    (d / "rank_0_0" / "model").write_bytes(bytes(range(256)) * 400)
    root = CacheRoot(tmp_path / "vllm")
    assert cc.sign_cache(root, SUBJECT, signer, NOW).action == "signed"
    repo = registry.new_repository("cache-candidates")
    image = push_image(registry.endpoint, repo, "v1")
    store = open_store(registry.url(repo), {"subject": "v1"}, timeout=30)
    keyring = keyring_of(signer)
    assert cc.push_cache(store, root, SUBJECT, keyring, NOW).action == "pushed"
    good_sig = cachedir.sidecar_path(d).read_bytes()
    sig = _bad_signature(good_sig) if forgery == "bad-signature" else good_sig
    _attach_forgery(
        registry,
        repo,
        image,
        [_layer(TAR_TYPE, b"not the signed archive"), _layer(DSSE, sig)],
        title=archives.archive_name(SUBJECT),
        artifact_type=CACHE_TYPE,
    )
    fresh = CacheRoot(tmp_path / "fresh")
    reader = open_store(registry.url(repo), {"subject": "v1"}, timeout=30)
    outcome = cc.pull_cache(reader, fresh, SUBJECT, keyring, NOW)
    assert outcome.action == "pulled", outcome
    assert "an older one verified" in outcome.detail
    assert verify_cache(fresh, SUBJECT, keyring, NOW).action == "verified"
    assert (fresh.directory(SUBJECT) / "rank_0_0" / "model").read_bytes() == bytes(range(256)) * 400
    node = CacheRoot(tmp_path / "node")  # the plugin's guard, before vLLM reads the cache
    private = tmp_path / "private"

    def fetch() -> tuple[Store, Deadline]:
        return open_store(registry.url(repo), {"subject": "v1"}, timeout=30), Deadline.after(30)

    guarded = guard(node, SUBJECT, keyring, NOW, private, fetch=fetch)
    assert guarded.action == "load", guarded
    assert "an older one verified" in guarded.detail
    assert (private / "rank_0_0" / "model").read_bytes() == bytes(range(256)) * 400


def test_one_prune_removes_every_candidate_that_fails_however_many(
    registry: DockerRegistry,
    signed_plans: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    key, plans = signed_plans
    repo = registry.new_repository("many-candidates")
    url = registry.url(repo)
    image = push_image(registry.endpoint, repo, "v1")
    assert main(["push", "--subject", "v1", "--fingerprint", FP, str(plans), url]) == 0
    good_sig = (plans / sig_name(FP)).read_bytes()
    junk = [  # each newer than the signed plan; more than a reader tries
        _attach_forgery(
            registry,
            repo,
            image,
            [_layer(PLAN_TYPE, plan_bytes(FP, kv=(90 + i) * 2**30)), _layer(DSSE, good_sig)],
        )
        for i in range(MAX_CANDIDATES + 1)
    ]
    spot = tmp_path / "spot"
    trusted = ["--trusted-keys", f"{key}.pub"]
    pull = ["pull", *trusted, "--subject", "v1", url, str(spot)]
    assert main(pull) == 1  # hidden: every candidate a reader tries fails
    capsys.readouterr()
    prune = ["prune", "--json", "--invalid", *trusted, "--subject", "v1", url]
    assert main([*prune, "--dry-run"]) == 0
    dry = json.loads(capsys.readouterr().out)  # one round: it says more may follow
    assert len(dry["deleted"]) == 1 and dry["more_candidates"] and dry["kept"] == 1
    assert registry.get(f"/v2/{repo}/manifests/{junk[-1]}", MANIFEST)[0] == 200
    code = main(prune)
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc
    for digest in junk:
        assert registry.get(f"/v2/{repo}/manifests/{digest}", MANIFEST)[0] == 404
    assert [d["fingerprint"] for d in doc["deleted"]] == [FP] * len(junk)
    assert sorted(d["version"] for d in doc["deleted"]) == sorted(junk)  # each one judged
    assert doc["kept"] == 1 and doc["changed"] == []  # the signed plan, kept
    assert not doc["more_candidates"]
    assert _tag(registry, repo, plan_name(FP))[0] == 200
    assert main(pull) == 0
    assert (spot / plan_name(FP)).read_bytes() == plan_bytes(FP)


def test_verify_subject_names_every_candidate_it_judged(
    registry: DockerRegistry,
    signed_plans: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``verify --subject`` reported the newest candidate only: an operator saw one plan fail
    and nothing of the signed one a reader would take, or of the other junk beside it."""
    key, plans = signed_plans
    repo = registry.new_repository("audit-candidates")
    url = registry.url(repo)
    image = push_image(registry.endpoint, repo, "v1")
    assert main(["push", "--subject", "v1", "--fingerprint", FP, str(plans), url]) == 0
    status, body = _tag(registry, repo, plan_name(FP))
    assert status == 200
    signed = "sha256:" + hashlib.sha256(body).hexdigest()
    good_sig = (plans / sig_name(FP)).read_bytes()
    older, newest = (
        _attach_forgery(
            registry,
            repo,
            image,
            [_layer(PLAN_TYPE, plan_bytes(FP, kv=(90 + i) * 2**30)), _layer(DSSE, good_sig)],
        )
        for i in range(2)
    )
    capsys.readouterr()
    verify = ["verify", "--json", "--trusted-keys", f"{key}.pub", "--subject", "v1", url]
    assert main(verify) == 1  # the newest candidate fails: that is still the audit's verdict
    [plan] = json.loads(capsys.readouterr().out)["plans"]
    assert plan["reason"] == "digest-mismatch"  # the genuine signature, over other bytes
    assert [(c["digest"], c["status"], c["reason"]) for c in plan["candidates"]] == [
        (older, "invalid", "digest-mismatch"),
        (signed, "valid", "ok"),
    ]
    assert f"an older one, {signed}, verifies" in plan["detail"]
    assert newest not in {c["digest"] for c in plan["candidates"]}  # the one reported first
