"""Plans attached to an image: ``push --subject``, ``ls --subject``, and deletes that never
leave a referrers index pointing at what is gone.

docker-registry 2.8 has no referrers API: there plancache keeps the tag schema's index
(``sha256-<hex>``). The native API is the stub's (tests/registry_stub.py), the one part no
registry installable here serves.
"""

from __future__ import annotations

import hashlib
import json
import urllib.request
from pathlib import Path

import pytest

from conftest import FP, plan_bytes
from plancache.cli.main import main
from plancache.keys.keyfile import generate_keypair
from plancache.storage.local.localdir import LocalPlanDir
from plancache.storage.store import open_store
from plancache.trust.plans.plan import plan_name
from registry_server import DockerRegistry
from registry_stub import RegistryStub
from store_servers import (
    registry,  # noqa: F401 - a fixture, named as a parameter
)

MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _put(base: str, path: str, data: bytes, content_type: str, method: str = "PUT") -> str:
    request = urllib.request.Request(
        base + path, data=data, method=method, headers={"Content-Type": content_type}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(response.headers.get("Location", ""))


def push_image(base: str, repo: str, tag: str) -> str:
    """A minimal image (one config, one layer) at ``tag``; returns its digest."""
    blobs = []
    for data in (b'{"architecture":"amd64","os":"linux","tag":"%s"}' % tag.encode(), b"layer"):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        location = _put(base, f"/v2/{repo}/blobs/uploads/", b"", "text/plain", "POST")
        if location.startswith("/"):
            location = base + location
        sep = "&" if "?" in location else "?"
        _put("", f"{location}{sep}digest={digest}", data, "application/octet-stream")
        blobs.append({"digest": digest, "size": len(data)})
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **blobs[0]},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **blobs[1]}],
        }
    ).encode()
    _put(base, f"/v2/{repo}/manifests/{tag}", manifest, MANIFEST)
    return "sha256:" + hashlib.sha256(manifest).hexdigest()


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    generate_keypair(tmp_path / "ci", force=False, comment="ci")
    LocalPlanDir(tmp_path / "ci-plans").write(FP, plan_bytes(), None)
    return tmp_path / "ci"


def test_push_subject_on_a_registry_without_the_api_keeps_the_tag_schema_index(
    registry: DockerRegistry, keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = registry.new_repository("app")
    url = registry.url(repo)
    image = push_image(registry.endpoint, repo, "v1")
    plans = str(tmp_path / "ci-plans")
    assert main(["push", "--key", str(keys), "--subject", "v1", plans, url]) == 0
    index_tag = "sha256-" + image.split(":")[1]
    status, body = registry.get(f"/v2/{repo}/manifests/{index_tag}")
    assert status == 200
    entries = json.loads(body)["manifests"]
    assert [e["artifactType"] for e in entries] == ["application/vnd.plancache.plan.v1"]
    capsys.readouterr()
    assert main(["ls", "--json", "--subject", f"{registry.host}/{repo}:v1", url]) == 0
    assert FP in capsys.readouterr().out
    other = push_image(registry.endpoint, repo, "v2")
    main(["ls", "--json", "--subject", f"@{other}", url])
    assert FP not in capsys.readouterr().out  # nothing is attached to v2
    open_store(url, timeout=30).delete([FP])  # a plain delete, no subject named
    status, body = registry.get(f"/v2/{repo}/manifests/{index_tag}")
    assert json.loads(body)["manifests"] == []  # the index points at nothing deleted


def test_push_subject_through_the_native_referrers_api(
    keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stub = RegistryStub()
    try:
        base = f"http://{stub.host}"
        image = push_image(base, "team/app", "v1")
        url = stub.url("team/app")
        plans = str(tmp_path / "ci-plans")
        assert main(["push", "--key", str(keys), "--subject", "v1", plans, url]) == 0
        index = stub.state.tags["sha256-" + image.split(":")[1]]  # the API took it, and the
        entries = json.loads(stub.state.manifests[index][0])["manifests"]  # tag schema has it
        assert [e["artifactType"] for e in entries] == ["application/vnd.plancache.plan.v1"]
        capsys.readouterr()
        assert main(["ls", "--json", "--subject", f"@{image}", url]) == 0
        assert FP in capsys.readouterr().out
        assert any("/referrers/" in p for _, p, _ in stub.state.requests)
        spot = tmp_path / "spot"
        code = main(
            [
                *("pull", "--trusted-keys", f"{keys}.pub", "--fingerprint", FP),
                *("--storage-option", f"subject=@{image}", url, str(spot)),
            ]
        )
        assert code == 0 and (spot / plan_name(FP)).read_bytes() == plan_bytes()
    finally:
        stub.stop()
