"""An object is what its slot says, on a real registry (Debian's docker-registry 2.8).

A co-tenant who may push tags but holds no key can point one plan's tag at another plan's
manifest (distribution answers any manifest PUT by tag), and can attach manifests titled like a
plan to an image by digest. These tests play that co-tenant with plain HTTP requests and check
that reads refuse what a slot does not name, that ``push`` and ``prune`` never delete the other
object's digest (distribution drops every tag on a deleted digest), and that a bad referrer
neither hides the signed plan nor survives ``prune --subject``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.request
from pathlib import Path

import pytest

from conftest import FP, plan_bytes
from plancache.cli.main import main
from plancache.keys.keyfile import generate_keypair
from plancache.storage.local.localdir import LocalPlanDir
from plancache.trust.plans.plan import plan_name, sig_name
from registry_server import DockerRegistry
from store_servers import (
    registry,  # noqa: F401 - a fixture, named as a parameter
)
from test_store_oci_referrers import push_image

FP_B = "fedcba9876543210"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"


def _put(registry: DockerRegistry, path: str, body: bytes, media_type: str) -> None:
    request = urllib.request.Request(
        registry.endpoint + path, data=body, method="PUT", headers={"Content-Type": media_type}
    )
    with urllib.request.urlopen(request, timeout=10):
        pass


def _tag(registry: DockerRegistry, repo: str, tag: str) -> tuple[int, bytes]:
    return registry.get(f"/v2/{repo}/manifests/{tag}", MANIFEST)


@pytest.fixture
def signed_plans(tmp_path: Path) -> tuple[Path, Path]:
    """A key and a directory of two signed plans, A (FP) and B (FP_B)."""
    key = tmp_path / "ci"
    generate_keypair(key, force=False, comment="ci")
    plans = tmp_path / "ci-plans"
    directory = LocalPlanDir(plans)
    directory.write(FP, plan_bytes(FP), None)
    directory.write(FP_B, plan_bytes(FP_B), None)
    assert main(["sign", "--key", str(key), str(plans)]) == 0
    return key, plans


def _aliased(registry: DockerRegistry, signed_plans: tuple[Path, Path]) -> tuple[str, str, bytes]:
    """A repository holding A and B, then B's tag pointed at A's manifest (the co-tenant)."""
    _, plans = signed_plans
    repo = registry.new_repository("alias")
    assert main(["push", str(plans), registry.url(repo)]) == 0
    status, a_manifest = _tag(registry, repo, plan_name(FP))
    assert status == 200
    _put(registry, f"/v2/{repo}/manifests/{plan_name(FP_B)}", a_manifest, MANIFEST)
    return repo, registry.url(repo), a_manifest


def test_a_tag_pointed_at_another_plans_manifest_reads_as_name_mismatch(
    registry: DockerRegistry,
    signed_plans: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    key, _ = signed_plans
    _, url, _ = _aliased(registry, signed_plans)
    capsys.readouterr()
    code = main(["verify", "--json", "--trusted-keys", f"{key}.pub", "--fingerprint", FP_B, url])
    assert code == 1
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert [(p["fingerprint"], p["reason"]) for p in plans] == [(FP_B, "name-mismatch")]
    assert f"titled '{plan_name(FP)}'" in plans[0]["detail"]  # the store says whose it is
    spot = tmp_path / "spot"
    assert main(["pull", "--trusted-keys", f"{key}.pub", url, str(spot)]) == 1
    assert sorted(p.name for p in spot.iterdir()) == [plan_name(FP), sig_name(FP)]  # A, as A


def test_prune_of_an_aliased_tag_never_deletes_the_other_plan(
    registry: DockerRegistry,
    signed_plans: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    key, _ = signed_plans
    repo, url, a_manifest = _aliased(registry, signed_plans)
    capsys.readouterr()
    main(["prune", "--json", "--invalid", "--trusted-keys", f"{key}.pub", url])
    doc = json.loads(capsys.readouterr().out)
    assert _tag(registry, repo, plan_name(FP)) == (200, a_manifest)  # A is still there
    assert _tag(registry, repo, sig_name(FP))[0] == 200
    assert doc["deleted"] == []  # nothing B's slot named was B's to delete
    assert doc["changed"] == [FP_B] and doc["kept"] == 2  # and both are there


def test_a_push_over_an_aliased_tag_writes_b_and_keeps_a(
    registry: DockerRegistry,
    signed_plans: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    key, plans = signed_plans
    repo, url, a_manifest = _aliased(registry, signed_plans)
    assert main(["push", "--fingerprint", FP_B, str(plans), url]) == 0
    assert _tag(registry, repo, plan_name(FP)) == (200, a_manifest)  # A kept
    spot = tmp_path / "spot"
    assert main(["pull", "--trusted-keys", f"{key}.pub", url, str(spot)]) == 0
    assert (spot / plan_name(FP_B)).read_bytes() == plan_bytes(FP_B)
    assert (spot / plan_name(FP)).read_bytes() == plan_bytes(FP)


def _attach_forgery(
    registry: DockerRegistry,
    repo: str,
    image: str,
    layers: list[dict[str, object]],
    *,
    title: str = plan_name(FP),
    artifact_type: str = "application/vnd.plancache.plan.v1",
) -> str:
    """The co-tenant's manifest titled like plan A (or ``title``), attached to ``image`` by
    digest (never tagged) and appended to the tag schema's index; returns its digest."""
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "artifactType": artifact_type,
            "config": {
                "mediaType": "application/vnd.oci.empty.v1+json",
                "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
                "size": 2,
                "data": "e30=",
            },
            "layers": layers,
            "annotations": {
                "org.opencontainers.image.title": title,
                **({"dev.plancache.signed": "true"} if len(layers) > 1 else {}),
            },
            "subject": {"mediaType": MANIFEST, "digest": image, "size": 0},
        }
    ).encode()
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    for layer in layers:  # distribution wants every layer's blob
        data = base64.b64decode(str(layer["data"]))
        location = _post_upload(registry, repo)
        request = urllib.request.Request(
            f"{location}{'&' if '?' in location else '?'}digest={layer['digest']}",
            data=data,
            method="PUT",
            headers={"Content-Type": "application/octet-stream"},
        )
        with urllib.request.urlopen(request, timeout=10):
            pass
    _put(registry, f"/v2/{repo}/manifests/{digest}", manifest, MANIFEST)
    index_tag = "sha256-" + image.split(":")[1]
    status, body = registry.get(f"/v2/{repo}/manifests/{index_tag}", INDEX)
    assert status == 200
    index = json.loads(body)
    entry = {
        "mediaType": MANIFEST,
        "digest": digest,
        "size": len(manifest),
        "artifactType": artifact_type,
        "annotations": {
            "org.opencontainers.image.title": title,
            **({"dev.plancache.signed": "true"} if len(layers) > 1 else {}),
        },
    }
    index["manifests"].append(entry)
    _put(registry, f"/v2/{repo}/manifests/{index_tag}", json.dumps(index).encode(), INDEX)
    return digest


def _post_upload(registry: DockerRegistry, repo: str) -> str:
    request = urllib.request.Request(
        f"{registry.endpoint}/v2/{repo}/blobs/uploads/", data=b"", method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        location = str(response.headers["Location"])
    return registry.endpoint + location if location.startswith("/") else location


def _layer(media_type: str, data: bytes) -> dict[str, object]:
    return {
        "mediaType": media_type,
        "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "data": base64.b64encode(data).decode(),
    }


PLAN_TYPE = "application/vnd.plancache.plan.v1+json"
DSSE = "application/vnd.dsse.envelope.v1+json"


def test_an_unsigned_referrer_titled_like_the_plan_does_not_hide_the_signed_one(
    registry: DockerRegistry,
    signed_plans: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    key, plans = signed_plans
    repo = registry.new_repository("referrers")
    url = registry.url(repo)
    image = push_image(registry.endpoint, repo, "v1")
    assert main(["push", "--subject", "v1", "--fingerprint", FP, str(plans), url]) == 0
    forged = plan_bytes(FP, kv=99 * 2**30)
    _attach_forgery(registry, repo, image, [_layer(PLAN_TYPE, forged)])  # newest, unsigned
    spot = tmp_path / "spot"
    pull = ["pull", "--trusted-keys", f"{key}.pub", "--subject", "v1", url, str(spot)]
    assert main(pull) == 0
    assert (spot / plan_name(FP)).read_bytes() == plan_bytes(FP)


def test_prune_subject_removes_a_referrer_that_fails_verification(
    registry: DockerRegistry,
    signed_plans: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    key, plans = signed_plans
    repo = registry.new_repository("referrers")
    url = registry.url(repo)
    image = push_image(registry.endpoint, repo, "v1")
    assert main(["push", "--subject", "v1", "--fingerprint", FP, str(plans), url]) == 0
    good_sig = (plans / sig_name(FP)).read_bytes()
    forged = plan_bytes(FP, kv=99 * 2**30)  # a bad signature: the good one, over other bytes
    bad = _attach_forgery(
        registry, repo, image, [_layer(PLAN_TYPE, forged), _layer(DSSE, good_sig)]
    )
    spot = tmp_path / "spot"
    pull = ["pull", "--trusted-keys", f"{key}.pub", "--subject", "v1", url, str(spot)]
    assert main(pull) == 0  # the newest candidate fails verification; the signed one is read
    assert (spot / plan_name(FP)).read_bytes() == plan_bytes(FP)
    (spot / plan_name(FP)).unlink()
    trusted = ["--trusted-keys", f"{key}.pub"]
    assert main(["prune", "--invalid", *trusted, "--subject", "v1", url]) == 0
    assert registry.get(f"/v2/{repo}/manifests/{bad}", MANIFEST)[0] == 404
    assert _tag(registry, repo, plan_name(FP))[0] == 200  # the signed plan stays
    assert main(pull) == 0
    assert (spot / plan_name(FP)).read_bytes() == plan_bytes(FP)


def _list_in_index(registry: DockerRegistry, repo: str, image: str, entry: object) -> None:
    """The co-tenant appends ``entry`` to ``image``'s tag-schema index (newest)."""
    tag = f"/v2/{repo}/manifests/sha256-{image.split(':')[1]}"
    status, body = registry.get(tag, INDEX)
    index = json.loads(body) if status == 200 else {"schemaVersion": 2, "mediaType": INDEX}
    index["manifests"] = [*index.get("manifests", []), entry]
    _put(registry, tag, json.dumps(index).encode(), INDEX)


def test_a_referrer_attached_to_another_image_is_neither_read_nor_pruned_for_this_one(
    registry: DockerRegistry,
    signed_plans: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    """Red team 47b: image Y's plan, listed by a co-tenant in image X's index, was read as X's
    plan and deleted from Y by ``prune --subject X``."""
    key, plans = signed_plans
    repo = registry.new_repository("two-images")
    url = registry.url(repo)
    x = push_image(registry.endpoint, repo, "x")
    y = push_image(registry.endpoint, repo, "y")
    assert main(["push", "--subject", "x", "--fingerprint", FP, str(plans), url]) == 0
    other = tmp_path / "y-plans"  # Y's own plan for FP: other content, unsigned
    LocalPlanDir(other).write(FP, plan_bytes(FP, kv=33 * 2**30), None)
    assert main(["push", "--allow-unsigned", "--subject", "y", str(other), url]) == 0
    status, body = registry.get(f"/v2/{repo}/manifests/sha256-{y.split(':')[1]}", INDEX)
    assert status == 200
    y_entry = json.loads(body)["manifests"][0]
    _list_in_index(registry, repo, x, y_entry)
    spot = tmp_path / "spot"
    pull = ["pull", "--trusted-keys", f"{key}.pub", "--subject", "x", url, str(spot)]
    assert main(pull) == 0
    assert (spot / plan_name(FP)).read_bytes() == plan_bytes(FP)  # X's, not Y's
    assert main(["prune", "--unsigned", "--subject", "x", url]) == 0
    assert registry.get(f"/v2/{repo}/manifests/{y_entry['digest']}", MANIFEST)[0] == 200


def test_another_kinds_manifest_at_a_plans_tag_blocks_neither_push_nor_prune(
    registry: DockerRegistry,
    signed_plans: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Red team 47b: a co-tenant who PUT an image's manifest at plan B's tag made every push of
    B fail (``is a 'None' artifact``) and ``prune`` of the whole repository exit 2; the image
    must survive both (its digest is the one at B's tag)."""
    key, plans = signed_plans
    repo = registry.new_repository("foreign")
    url = registry.url(repo)
    assert main(["push", str(plans), url]) == 0
    push_image(registry.endpoint, repo, "v1")
    status, image = _tag(registry, repo, "v1")
    assert status == 200
    _put(registry, f"/v2/{repo}/manifests/{plan_name(FP_B)}", image, MANIFEST)
    capsys.readouterr()
    assert main(["prune", "--json", "--invalid", "--trusted-keys", f"{key}.pub", url]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["deleted"] == [] and doc["changed"] == [FP_B]  # B's tag is not B's: kept
    assert _tag(registry, repo, "v1") == (200, image)
    assert main(["push", "--fingerprint", FP_B, str(plans), url]) == 0  # CI repairs B
    assert _tag(registry, repo, "v1") == (200, image)
    spot = tmp_path / "spot"
    assert main(["pull", "--trusted-keys", f"{key}.pub", url, str(spot)]) == 0
    assert (spot / plan_name(FP_B)).read_bytes() == plan_bytes(FP_B)
