"""The store contract: what every store backend does, proved on each against a real server.

A new store passes this file or is not a store (docs/test-suite.md). Every test runs on every
backend: ``file://``, ``memory://``, S3 (s3fs against moto's server over HTTP), GCS
(gcp-storage-emulator), Azure Blob (Azurite over HTTP) and an OCI registry (Debian's
``docker-registry``), one server of each kind per session (tests/store_servers.py). The
properties:

* **round trips**: put, list, fetch, delete, fetch after delete, empty objects, and every name
  form a store holds (plan, sidecar, plan set, compile cache); the CLI's whole journey with
  tampering in the store rejected;
* **reads capped**: an object over its cap is ``too-large``, never read whole;
* **listings bounded** by their cap (:data:`MAX_NAMES` names) and budget (:data:`MAX_PAGES`
  pages), lowered here to keep it fast; hostile names ignored; a name listed twice counts once;
* **deletes only of the version judged** (:mod:`plancache.storage.conditional_deletes`): an
  object changed after it was judged is kept and reported ``changed``; on stores with a
  precondition (S3, Azure, the registry) even when it changes between the re-read and the
  delete; on ``file://`` and ``memory://`` (no precondition) that window is what remains;
* **errors as their kinds**: absent is no error; an unreachable endpoint is ``store-error`` or
  ``timeout`` within the deadline, on the injectable clock; permission denied is typed;
* **where a read was served from**: only a registry read through its mirror names one.

Written against the store's public API (``open_store``, ``Store``'s methods, the plan-set and
compile-cache object functions, ``conditional_deletes``' functions and the CLI). Two things are
not observable there, each in one helper below: :meth:`Backend.plant` writes behind the store's
back (an oversized object, a hostile name) with each backend's own client, and
:func:`lowered_caps` lowers the listing caps wherever a storage module binds them.

What stays elsewhere, and why: the GCS precondition (gcp-storage-emulator ignores
``ifGenerationMatch``: tests/test_prune_conditional.py's stand-in) and misbehaving servers that
a real one cannot imitate (tests/test_prune_conditional.py's fault server, tests/
test_store_oci_listings.py's endless tag list, tests/test_store_oci_realms.py's token realms on
other hosts, tests/test_store_bounds.py's bodies that ignore a range).
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import os
import sys
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from conftest import FP, GIB, plan_bytes, raw
from fake_clock import FakeClock
from plancache.cli.main import main
from plancache.clock import Deadline
from plancache.keys.schemes import load_signer
from plancache.pipeline.resolver import utcnow
from plancache.storage.compile_cache import archives
from plancache.storage.conditional_deletes import content_digest, delete_if_unchanged
from plancache.storage.local.localdir import LocalPlanDir
from plancache.storage.oci.mirrors.mirror_reads import forget, mirrors_read, store_key
from plancache.storage.plan_set_objects import delete_sets, read_set, set_names
from plancache.storage.store import Store, open_store
from plancache.trust.errors import PlanCacheError, Reason, Rejected, StoreError
from plancache.trust.plans.plan import MAX_PLAN_BYTES, plan_name, sig_name
from plancache.trust.plans.plan_set_names import set_name
from plancache.trust.signing import sign_plan
from registry_server import DockerRegistry, registry_binary
from registry_stub import RegistryStub
from store_servers import (
    GcsEmulator,
    LoopbackServer,
    MotoServer,
    azurite,  # noqa: F401 - a fixture, named as a parameter
    closed_port,
    gcs_emulator,  # noqa: F401 - a fixture, named as a parameter
    moto_server,  # noqa: F401 - a fixture, named as a parameter
    registry,  # noqa: F401 - a fixture, named as a parameter
    tls_registry,  # noqa: F401 - a fixture, named as a parameter
)

FP2 = "fedcba9876543210"
FP3 = "00000000deadbeef"
BACKENDS = ("file", "memory", "s3", "gcs", "azure", "oci")
REMOTE = ("s3", "gcs", "azure", "oci")
"""Backends behind an endpoint (the others cannot be unreachable)."""
CONDITIONAL = ("s3", "azure", "oci")
"""Backends whose server keeps a delete's precondition here (the GCS emulator ignores it)."""
SUBJECT = "0123456789"
"""A compile cache's name (``VLLM_USE_AOT_COMPILE=0`` form)."""

OCI_PLAN_TYPE = "application/vnd.plancache.plan.v1"
OCI_LAYER_TYPES = {
    ".json": "application/vnd.plancache.plan.v1+json",
    ".sig": "application/vnd.dsse.envelope.v1+json",
}
OCI_EMPTY = b"{}"


# -- the backends ---------------------------------------------------------------------------------


@dataclass
class Backend:
    """One store location on one backend, and how to reach it behind the store's back."""

    name: str
    url: str
    options: dict[str, Any] = field(default_factory=dict)
    registry: DockerRegistry | None = None

    def store(self, timeout: float = 30.0) -> Store:
        return open_store(self.url, self.options, timeout)

    def cli_options(self) -> list[str]:
        return [
            x for k, v in self.options.items() for x in ("--storage-option", f"{k}={json.dumps(v)}")
        ]

    def put(self, name: str, data: bytes) -> None:
        """Write an object through another store (another operator's push)."""
        self.store().put_many({name: data})

    def remove(self, name: str) -> None:
        """Delete an object through another store (another operator's prune)."""
        self.store().delete_objects([name])

    def read(self, fp: str) -> tuple[bytes | None, bytes | None]:
        """What a fresh store reads for ``fp`` now: (plan, sidecar)."""
        return raw(self.store().fetch(fp))

    def plant(self, name: str, data: bytes) -> None:
        """Write any bytes under any name behind the store's back (a hostile or careless bucket
        writer), with the backend's own client, not plancache's: the one place this file reaches
        past the store's API, because a store refuses to write what a hostile writer can."""
        if self.registry is not None:
            _registry_plant(self.registry, self.url, name, data)
            return
        if self.name == "gcs":  # the emulator's JSON API (gcsfs retries its 4xx for minutes)
            bucket, prefix = self.url.removeprefix("gs://").split("/", 1)
            query = urllib.parse.urlencode({"uploadType": "media", "name": f"{prefix}/{name}"})
            urllib.request.urlopen(
                urllib.request.Request(
                    f"{os.environ['STORAGE_EMULATOR_HOST']}/upload/storage/v1/b/{bucket}/o?{query}",
                    data=data,
                    method="POST",
                    headers={"Content-Type": "application/octet-stream"},
                ),
                timeout=30,
            ).read()
            return
        import fsspec

        fs, root = fsspec.url_to_fs(
            self.url, skip_instance_cache=True, use_listings_cache=False, **self.options
        )
        path = f"{root.rstrip('/')}/{name}"
        if self.name == "file":
            fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, data)


def _registry_plant(registry: DockerRegistry, url: str, name: str, data: bytes) -> None:
    """An artifact titled ``name`` at tag ``name`` holding ``data``, written with the registry's
    own HTTP API (the layout of tests/test_store_oci.py): inline when small, else as a blob."""
    repo = url.split("/", 3)[3]
    layer: dict[str, Any] = {
        "mediaType": OCI_LAYER_TYPES[name[name.rfind(".") :]]
        if name.endswith((".json", ".sig"))
        else "application/octet-stream",
        "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "annotations": {"org.opencontainers.image.title": name},
    }
    if len(data) <= 4096:
        layer["data"] = base64.b64encode(data).decode()
    for blob in (OCI_EMPTY, data):
        _registry_blob(registry, repo, blob)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": OCI_PLAN_TYPE,
        "config": {
            "mediaType": "application/vnd.oci.empty.v1+json",
            "digest": "sha256:" + hashlib.sha256(OCI_EMPTY).hexdigest(),
            "size": 2,
            "data": base64.b64encode(OCI_EMPTY).decode(),
        },
        "layers": [layer],
        "annotations": {"org.opencontainers.image.title": name},
    }
    _registry_request(
        registry,
        "PUT",
        f"/v2/{repo}/manifests/{name}",
        json.dumps(manifest).encode(),
        "application/vnd.oci.image.manifest.v1+json",
    )


def _registry_blob(registry: DockerRegistry, repo: str, data: bytes) -> None:
    location = _registry_request(registry, "POST", f"/v2/{repo}/blobs/uploads/", b"")
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    joiner = "&" if "?" in location else "?"
    _registry_request(
        registry, "PUT", f"{location}{joiner}digest={digest}", data, "application/octet-stream"
    )


def _registry_request(
    registry: DockerRegistry, method: str, path: str, body: bytes, media_type: str = ""
) -> str:
    target = path if path.startswith("http") else registry.endpoint + path
    headers = {"Content-Type": media_type} if media_type else {}
    request = urllib.request.Request(target, data=body, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        location = response.headers.get("Location") or ""
    return location


@pytest.fixture(params=BACKENDS)
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Backend]:
    kind = request.param
    if kind == "file":
        # the store's parent exists, as a mounted volume's does (a push refuses a missing one)
        (tmp_path / "bucket").mkdir()
        yield Backend(kind, (tmp_path / "bucket" / "plans").as_uri())
    elif kind == "memory":
        yield Backend(kind, f"memory://plancache-{uuid.uuid4().hex}/plans")
    elif kind == "s3":
        moto: MotoServer = request.getfixturevalue("moto_server")
        yield Backend(kind, f"s3://{moto.new_bucket()}/team/plans", moto.options)
    elif kind == "azure":
        server = request.getfixturevalue("azurite")
        yield Backend(kind, f"az://{server.new_container()}/team/plans", server.options)
    elif kind == "gcs":
        gcs: GcsEmulator = request.getfixturevalue("gcs_emulator")
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
        yield Backend(kind, f"gs://{gcs.new_bucket()}/plans", {"token": "anon"})
    else:
        registry: DockerRegistry = request.getfixturevalue("registry")
        yield Backend(kind, registry.url(registry.new_repository()), registry=registry)


def only(*names: str) -> pytest.MarkDecorator:
    """Run a test on these backends only (the others cannot show the property: say why)."""
    return pytest.mark.parametrize("backend", names, indirect=True)


@pytest.fixture
def lowered_caps(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Lower the listing caps (``MAX_NAMES``, ``MAX_PAGES``, ``PAGE_SIZE``) in every storage
    module that binds them, so that a listing past them takes a few objects, not 100,000: the
    one place this file reaches inside the storage modules (the caps are module constants)."""

    def lower(**caps: int) -> None:
        importlib.import_module("plancache.storage.listing")
        for module_name, module in list(sys.modules.items()):
            if module is None or not module_name.startswith("plancache.storage"):
                continue
            for cap, value in caps.items():
                if hasattr(module, cap):
                    monkeypatch.setattr(module, cap, value)

    return lower


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- round trips ----------------------------------------------------------------------------------


def test_round_trip_fetch_list_delete(backend: Backend) -> None:
    store = backend.store()
    assert store.fingerprints() == []
    assert raw(store.fetch(FP)) == (None, None)  # absent: no bytes, no error
    store.put(FP, b"plan-bytes", b"sig-bytes")
    store.put(FP2, b"unsigned-plan", None)
    assert store.fingerprints() == [FP, FP2]
    assert raw(store.fetch(FP)) == (b"plan-bytes", b"sig-bytes")
    assert raw(store.fetch(FP2)) == (b"unsigned-plan", None)
    items = [
        (r.fingerprint, r.plan_bytes, r.sig_bytes, r.error)
        for r in store.fetch_many([FP2, FP3, FP])
    ]
    assert items == [
        (FP2, b"unsigned-plan", None, None),
        (FP3, None, None, None),
        (FP, b"plan-bytes", b"sig-bytes", None),
    ]
    listing = store.list_objects()
    assert set(listing) == {plan_name(FP), sig_name(FP), plan_name(FP2)}
    assert listing[plan_name(FP)].size in (len(b"plan-bytes"), None)  # a registry states none
    store.delete([FP, FP3])
    assert store.fingerprints() == [FP2]
    assert raw(store.fetch(FP)) == (None, None)  # fetch after delete: absent again
    store.delete([FP])  # gone is not an error
    store.put(FP, b"again", None)  # and the name can be written again
    assert raw(backend.store().fetch(FP)) == (b"again", None)


def test_every_name_form_round_trips(backend: Backend) -> None:
    """Plan sets and compile caches live beside the plans, through their own functions: each is
    written, listed, read and deleted on every backend, and none is taken for a plan."""
    store = backend.store()
    name = set_name([FP, FP2])
    store.put_many({name: b"set-bytes", plan_name(FP): b"plan"})
    assert set_names(store) == [name] and store.fingerprints() == [FP]
    assert read_set(store, name) == b"set-bytes"
    assert delete_sets(store, [name]) == {}
    assert set_names(store) == [] and read_set(store, name) is None
    for object_name, data in (
        (archives.archive_name(SUBJECT), b"archive"),
        (archives.sig_name(SUBJECT), b"archive-sig"),
        (archives.headers_name(SUBJECT), b""),  # empty objects too
    ):
        archives.put_object(store, object_name, data)
        assert archives.get_object(store, object_name, 1024) == data
    assert archives.list_subjects(store) == [SUBJECT]
    assert store.fingerprints() == [FP]  # nothing of a compile cache is a plan
    with pytest.raises(Rejected) as err:
        archives.get_object(store, archives.archive_name(SUBJECT), 3)  # over its cap
    assert err.value.reason is Reason.TOO_LARGE


def test_an_empty_sidecar_reads_as_empty_everywhere(backend: Backend) -> None:
    """A range over an empty object is 416 on S3, GCS and Azure: read as empty bytes on every
    backend (and on S3 through both read paths: plain botocore for a first few reads, s3fs once
    a listing made it), so the verifier, not the store, rejects it."""
    backend.put(plan_name(FP), b"plan-bytes")
    backend.put(sig_name(FP), b"")
    assert raw(backend.store().fetch(FP)) == (b"plan-bytes", b"")
    listed = backend.store()
    assert listed.fingerprints() == [FP]
    assert raw(listed.fetch(FP)) == (b"plan-bytes", b"")


def test_empty_object_reads_as_empty(backend: Backend) -> None:
    # S3 answers a byte range over an empty object with 416; it is still just empty
    backend.put(plan_name(FP), b"")
    assert raw(backend.store().fetch(FP)) == (b"", None)


def test_invalid_fingerprints_never_reach_the_store(backend: Backend) -> None:
    store = backend.store()
    for bad in ("../../etc/passwd", "0123456789ABCDEF", "0123"):
        with pytest.raises(PlanCacheError) as err:
            raw(store.fetch(bad))
        assert err.value.reason is Reason.MALFORMED
    with pytest.raises(Rejected) as err:
        store.put_many({"notes.txt": b"x"})
    assert err.value.reason is Reason.MALFORMED


# -- reads capped ---------------------------------------------------------------------------------


def test_oversized_objects_are_refused_not_downloaded(backend: Backend) -> None:
    oversized = b"{" + b" " * (MAX_PLAN_BYTES + 1000) + b"}"
    backend.plant(plan_name(FP), oversized)
    with pytest.raises(PlanCacheError) as err:
        raw(backend.store().fetch(FP))
    assert err.value.reason is Reason.TOO_LARGE
    [result] = backend.store().fetch_many([FP])
    assert result.error is not None and result.error.reason is Reason.TOO_LARGE
    with pytest.raises(Rejected) as err:  # and no store writes one
        backend.store().put(FP2, oversized, None)
    assert err.value.reason is Reason.TOO_LARGE
    assert raw(backend.store().fetch(FP2)) == (None, None)
    if backend.registry is not None:
        # where the wire can be watched: the registry's log shows the blob was never asked for
        # (its size in the manifest was judged first)
        blob = "sha256:" + hashlib.sha256(oversized).hexdigest()
        reads = backend.registry.settled_requests(f"/blobs/{blob}")
        assert [m for m, _ in reads if m == "GET"] == []


# -- listings -------------------------------------------------------------------------------------


def test_hostile_names_in_a_listing_are_ignored(backend: Backend) -> None:
    names = [
        "startup_plan_0123456789ABCDEF.json",  # upper case
        "startup_plan_0123456789abcde.json",  # 15 hex
        "startup_plan_0123456789abcdef.json.tmp",
        "startup_plan_0123456789abcdef.jsonx",
    ]
    if backend.registry is None:  # not tags: no registry can hold these names
        names += ["sub/startup_plan_fedcba9876543210.json", "..startup_plan_fedcba9876543210.json"]
    for name in names:
        backend.plant(name, b"x")
    backend.put(plan_name(FP3), b"ok")
    assert backend.store().fingerprints() == [FP3]
    assert set(backend.store().list_objects()) == {plan_name(FP3)}


def test_a_listing_past_its_name_cap_is_too_large(
    backend: Backend, lowered_caps: Callable[..., None]
) -> None:
    store = backend.store()
    for fp in (FP, FP2):
        store.put(fp, plan_bytes(fp=fp), b"sig")
    lowered_caps(MAX_NAMES=4)
    assert len(store.list_objects()) == 4  # at the cap: whole
    store.put(FP3, plan_bytes(fp=FP3), None)
    with pytest.raises(Rejected) as err:
        store.list_objects()
    assert err.value.reason is Reason.TOO_LARGE
    with pytest.raises(Rejected):
        store.fingerprints()


@only("s3", "azure")
def test_a_listing_past_its_page_budget_is_too_large(
    backend: Backend, lowered_caps: Callable[..., None]
) -> None:
    """Only where the server pages as asked: a directory and ``memory://`` are one page,
    gcp-storage-emulator ignores ``maxResults`` and docker-registry ``?n=`` (the page budget
    against a registry that pages without end: tests/test_store_oci_listings.py; an S3 listing
    that never ends: tests/test_store_bounds.py). The budget is the store's own loop, shared
    by every backend."""
    store = backend.store()
    for fp in (FP, FP2, FP3):
        store.put(fp, plan_bytes(fp=fp), None)
    lowered_caps(PAGE_SIZE=1, MAX_PAGES=3)
    assert store.fingerprints() == [FP3, FP, FP2]  # three pages: within the budget
    lowered_caps(PAGE_SIZE=1, MAX_PAGES=2)
    with pytest.raises(Rejected) as err:
        store.fingerprints()
    assert err.value.reason is Reason.TOO_LARGE and "pages" in err.value.detail


# -- the CLI's journey ----------------------------------------------------------------------------


def test_cli_journey(backend: Backend, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    opts = backend.cli_options()
    assert run(capsys, "keygen", str(tmp_path / "ci"))[0] == 0
    ci = LocalPlanDir(tmp_path / "ci-plans")
    ci.write(FP, plan_bytes(), None)
    ci.write(FP2, plan_bytes(fp=FP2, kv=GIB, baseline=2 * GIB), None)
    keys = str(tmp_path / "ci.pub")

    code, out, err = run(capsys, "push", *opts, str(ci.path), backend.url)
    assert code == 1 and "0 uploaded" in out and "unsigned" in err  # refused without a key

    code, out, _ = run(
        capsys, "push", "--key", str(tmp_path / "ci"), "--json", *opts, str(ci.path), backend.url
    )
    report = json.loads(out)
    assert code == 0 and report["uploaded"] == 2 and report["objects_uploaded"] == 4
    code, out, _ = run(
        capsys, "push", "--key", str(tmp_path / "ci"), "--json", *opts, str(ci.path), backend.url
    )
    assert (
        code == 0 and json.loads(out)["unchanged"] == 2 and json.loads(out)["objects_uploaded"] == 0
    )

    code, out, _ = run(capsys, "verify", "--trusted-keys", keys, *opts, backend.url)
    assert code == 0 and out.count("valid") == 2
    code, out, _ = run(capsys, "ls", "--json", *opts, backend.url)
    assert code == 0 and {p["kv_cache_memory_bytes"] for p in json.loads(out)["plans"]} == {
        20 * GIB,
        GIB,
    }

    spot = tmp_path / "spot"
    code, out, _ = run(
        capsys, "pull", "--trusted-keys", keys, "--fingerprint", FP, *opts, backend.url, str(spot)
    )
    assert code == 0 and (spot / plan_name(FP)).read_bytes() == plan_bytes()
    assert sorted(p.name for p in spot.iterdir()) == [plan_name(FP), sig_name(FP)]

    # The bucket is writable by someone hostile: a bigger kv value for FP2, FP's sidecar swapped.
    backend.put(plan_name(FP2), plan_bytes(fp=FP2, kv=2 * GIB - 1, baseline=2 * GIB))
    backend.put(sig_name(FP), b"{}")
    backend.put(plan_name(FP3), plan_bytes(fp=FP3))
    fresh = tmp_path / "fresh"
    code, out, _ = run(
        capsys, "pull", "--json", "--trusted-keys", keys, *opts, backend.url, str(fresh)
    )
    plans = {p["fingerprint"]: p for p in json.loads(out)["plans"]}
    assert code == 1
    assert plans[FP]["reason"] == "malformed" and plans[FP2]["reason"] == "digest-mismatch"
    assert plans[FP3]["reason"] == "unsigned"
    assert not fresh.exists() or list(fresh.iterdir()) == []  # nothing unverified under any name
    code, out, _ = run(capsys, "verify", "--trusted-keys", keys, *opts, backend.url)
    assert code == 1


def test_prune(backend: Backend, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    opts = backend.cli_options()
    for name in ("old", "new"):
        run(capsys, "keygen", str(tmp_path / name))
    ci = LocalPlanDir(tmp_path / "ci")
    ci.write(FP, plan_bytes(), None)
    run(capsys, "push", "--key", str(tmp_path / "old"), *opts, str(ci.path), backend.url)
    ci2 = LocalPlanDir(tmp_path / "ci2")
    ci2.write(FP2, plan_bytes(fp=FP2), None)
    assert (
        run(capsys, "push", "--key", str(tmp_path / "new"), *opts, str(ci2.path), backend.url)[0]
        == 0
    )

    old_pub = (tmp_path / "old.pub").read_text()
    trusted = tmp_path / "trusted"
    trusted.write_text((tmp_path / "new.pub").read_text() + "@revoked " + old_pub)
    code, out, _ = run(
        capsys,
        "prune",
        "--revoked",
        "--dry-run",
        "--trusted-keys",
        str(trusted),
        *opts,
        backend.url,
    )
    assert code == 0 and FP in out and FP2 not in out
    assert backend.store().fingerprints() == [FP, FP2]
    # gcp-storage-emulator ignores ifGenerationMatch: refused, then pruned on purpose
    if backend.name == "gcs":
        code, out, err = run(
            capsys, "prune", "--revoked", "--trusted-keys", str(trusted), *opts, backend.url
        )
        assert (
            code == 2 and "--unconditional" in err and backend.store().fingerprints() == [FP, FP2]
        ), err
        opts.append("--unconditional")
    code, out, _ = run(
        capsys, "prune", "--revoked", "--json", "--trusted-keys", str(trusted), *opts, backend.url
    )
    assert code == 0 and [d["fingerprint"] for d in json.loads(out)["deleted"]] == [FP]
    assert backend.store().fingerprints() == [FP2]
    assert sig_name(FP) not in backend.store().list_objects()

    code, out, _ = run(capsys, "prune", "--older-than", "1d", *opts, backend.url)
    assert code == 0 and backend.store().fingerprints() == [FP2]  # signed just now: kept
    signer = load_signer(str(tmp_path / "new"))
    old = plan_bytes(fp=FP3)
    backend.store().put(
        FP3, old, sign_plan(plan_name(FP3), old, signer, utcnow() - timedelta(days=45))
    )
    code, out, _ = run(capsys, "prune", "--older-than", "30d", *opts, backend.url)
    assert code == 0 and FP3 in out and backend.store().fingerprints() == [FP2]
    assert run(capsys, "prune", "--revoked", *opts, backend.url)[0] == 2  # needs trusted keys


def test_missing_locations_fail_and_empty_ones_say_so(
    backend: Backend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo in the bucket (or directory, or repository) is exit 2 on every backend; an empty
    prefix fails verify."""
    opts = backend.cli_options()
    run(capsys, "keygen", str(tmp_path / "k"))
    keys = ["--trusted-keys", str(tmp_path / "k.pub")]
    scheme, rest = backend.url.split("://", 1)
    if backend.registry is not None:  # a registry's repository: a name under the same host
        missing = f"oci://{rest.split('/', 1)[0]}/no-such-{uuid.uuid4().hex[:8]}/plans"
    else:
        missing = (
            f"{scheme}://{'/' if scheme == 'file' else ''}no-such-{uuid.uuid4().hex[:8]}/plans"
        )
    code, out, err = run(capsys, "verify", *keys, *opts, missing)
    assert code == 2 and "does not exist" in err and out == ""
    backend.put(plan_name(FP), plan_bytes())  # makes the bucket's prefix exist
    empty = backend.url.rsplit("/", 1)[0] + "/empty"
    if backend.name in ("file", "memory"):  # no buckets: the directory itself must exist
        assert run(capsys, "verify", *keys, *opts, empty)[0] == 2
        import fsspec

        fs, root = fsspec.url_to_fs(empty, skip_instance_cache=True)
        fs.makedirs(root, exist_ok=True)
    if backend.registry is not None:  # a repository exists once something was pushed to it
        assert run(capsys, "verify", *keys, *opts, empty)[0] == 2
        return
    code, _, err = run(capsys, "verify", *keys, *opts, empty)
    assert code == 1 and f"no plans in {empty}" in err
    assert run(capsys, "verify", "--allow-empty", *keys, *opts, empty)[0] == 0


@only("file", "memory", "s3", "gcs", "azure")
def test_an_empty_prefix_names_the_deeper_prefixes_that_hold_plans(
    backend: Backend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The walk below an empty prefix, page by page on S3, GCS and Azure (sub-prefixes from the
    listing's CommonPrefixes / prefixes / blob prefixes), a directory walk elsewhere. Not on a
    registry: a repository has no prefixes below it (another repository is another store)."""
    run(capsys, "keygen", str(tmp_path / "k"))
    for below in ("llama/h100", "llama/a100", "mistral/l4/old"):
        backend.plant(f"{below}/{plan_name(FP)}", plan_bytes())
    backend.plant("llama/notes.txt", b"not a plan")
    code, _, err = run(
        capsys,
        "verify",
        "--trusted-keys",
        str(tmp_path / "k.pub"),
        *backend.cli_options(),
        backend.url,
    )
    assert code == 1 and f"no plans in {backend.url}" in err, err
    named = err.split("plans found below it in: ", 1)[1].strip().split(", ")
    assert sorted(named) == sorted(
        f"{backend.url}/{b}" for b in ("llama/h100", "llama/a100", "mistral/l4/old")
    ), err


def test_a_registry_listing_naming_a_tag_twice_names_it_once() -> None:
    """A listing is the store's say: one that names an object twice names it once, so it counts
    once everywhere (verify, ls, pull, prune). No real server lists twice on demand; the
    registry's is tests/registry_stub.py's tag list, S3's tests/test_prune_conditional.py's
    fault server (``test_a_listing_that_names_each_object_three_times_counts_each_once``)."""
    stub = RegistryStub()
    try:
        store = open_store(stub.url("plancache/twice"), timeout=30)
        store.put(FP, b"plan", b"sig")
        store.put(FP2, b"plan-2", None)
        tags = [plan_name(FP), plan_name(FP2)] * 3
        stub.state.tags_body = json.dumps({"tags": tags}).encode()
        assert store.fingerprints() == [FP, FP2]
        listed = [info.name for info in store.iter_objects()]
        assert sorted(listed) == sorted(set(listed)) and plan_name(FP) in listed
    finally:
        stub.stop()


# -- deletes only of the version judged -----------------------------------------------------------

SIG = b"sig-of-" + FP.encode()
NEW_PLAN = plan_bytes(kv=3 * GIB)  # re-pushed meanwhile: other bytes
NEW_SIG = b"re-signed"


def seed(backend: Backend) -> dict[str, str]:
    """FP signed, FP2 with an empty sidecar (a 416 to a ranged read), FP3 unsigned; their
    digests, as prune judged them."""
    plans = {
        FP: (plan_bytes(), SIG),
        FP2: (plan_bytes(fp=FP2), b""),
        FP3: (plan_bytes(fp=FP3), None),
    }
    for fp, (plan, sig) in plans.items():
        backend.store().put(fp, plan, sig)
    return {fp: content_digest(plan, sig) for fp, (plan, sig) in plans.items()}


def prune(backend: Backend, judged: dict[str, str], **kwargs: Any) -> tuple[list[str], list[str]]:
    """:func:`delete_if_unchanged`; on gcp-storage-emulator, which ignores the precondition (so
    the check refuses it: tests/test_prune_conditional.py), unconditionally, as
    ``prune --unconditional`` would."""
    store = backend.store()
    return delete_if_unchanged(store, judged, unconditional=backend.name == "gcs", **kwargs)


def replace_in_window(
    backend: Backend, name: str, data: bytes
) -> tuple[list[list[str]], Callable[[list[str]], None]]:
    """A ``before_delete`` hook that rewrites ``name`` (another operator's push between the
    re-read and the delete), and the list of the fingerprints it was called with."""
    calls: list[list[str]] = []

    def hook(fps: list[str]) -> None:
        calls.append(list(fps))
        backend.put(name, data)

    return calls, hook


def test_unchanged_objects_are_deleted(backend: Backend) -> None:
    judged = seed(backend)
    deleted, changed = prune(backend, judged)
    assert deleted == [FP, FP2, FP3] and changed == []
    assert all(backend.read(fp) == (None, None) for fp in judged)
    assert backend.store().list_objects() == {}  # no sidecar, no canary left behind


def test_changed_before_the_reread_is_kept(backend: Backend) -> None:
    judged = seed(backend)
    backend.put(plan_name(FP), NEW_PLAN)
    deleted, changed = prune(backend, judged)
    assert deleted == [FP2, FP3] and changed == [FP]
    assert backend.read(FP) == (NEW_PLAN, SIG)


@only(*CONDITIONAL)
def test_plan_replaced_after_the_reread_is_kept_with_its_sidecar(backend: Backend) -> None:
    judged = seed(backend)
    calls, hook = replace_in_window(backend, plan_name(FP), NEW_PLAN)
    deleted, changed = delete_if_unchanged(backend.store(), judged, before_delete=hook)
    assert calls == [[FP, FP2, FP3]]  # the hook ran after the re-read found all three unchanged
    assert changed == [FP] and deleted == [FP2, FP3]  # reported as changed, not as an error
    assert backend.read(FP) == (NEW_PLAN, SIG)
    assert all(backend.read(fp) == (None, None) for fp in (FP2, FP3))


@only(*CONDITIONAL)
def test_sidecar_replaced_after_the_reread_is_kept(backend: Backend) -> None:
    judged = seed(backend)
    _, hook = replace_in_window(backend, sig_name(FP), NEW_SIG)
    deleted, changed = delete_if_unchanged(backend.store(), judged, before_delete=hook)
    if backend.registry is not None:
        # a registry's signature is a layer of its plan's manifest: a new signature is a new
        # manifest, so the plan is no longer the version judged, and both are kept
        assert deleted == [FP2, FP3] and changed == [FP]
        assert backend.read(FP) == (plan_bytes(), NEW_SIG)
        return
    assert deleted == [FP, FP2, FP3] and changed == []  # the plan was still the judged one: gone
    assert backend.read(FP) == (None, None)
    assert set(backend.store().list_objects()) == {sig_name(FP)}  # the new sidecar, alone


@only("file", "memory")
def test_without_a_precondition_the_window_remains(backend: Backend) -> None:
    """Documented limit (conditional_deletes' docstring): fsspec offers no conditional delete
    for these, so a plan replaced between the re-read and the delete is deleted (a change
    before the re-read is kept: :func:`test_changed_before_the_reread_is_kept`)."""
    judged = seed(backend)
    _, hook = replace_in_window(backend, plan_name(FP), NEW_PLAN)
    deleted, changed = delete_if_unchanged(backend.store(), judged, before_delete=hook)
    assert deleted == [FP, FP2, FP3] and changed == [] and backend.read(FP)[0] is None


def test_objects_gone_before_the_delete_are_fine(backend: Backend) -> None:
    judged = seed(backend)

    def hook(fps: list[str]) -> None:
        backend.remove(plan_name(FP))  # someone else's prune got there first
        backend.remove(sig_name(FP))
        backend.remove(sig_name(FP2))

    deleted, changed = prune(backend, judged, before_delete=hook)
    if backend.registry is not None:
        # FP2's signature is a layer of its manifest: removing it made a new manifest, which is
        # not the version judged (kept, now unsigned); FP's manifest is gone: fine
        assert deleted == [FP, FP3] and changed == [FP2]
        assert backend.read(FP2) == (plan_bytes(fp=FP2), None)
        return
    assert deleted == [FP, FP2, FP3] and changed == []
    assert all(backend.read(fp) == (None, None) for fp in judged)


def test_gone_before_the_reread_is_changed_not_an_error(backend: Backend) -> None:
    judged = seed(backend)
    backend.remove(plan_name(FP))
    deleted, changed = prune(backend, judged)
    assert deleted == [FP2, FP3] and changed == [FP]


# -- errors as their kinds ------------------------------------------------------------------------


def unreachable(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict[str, Any]]:
    """The same store's URL and options with its endpoint on a closed loopback port."""
    port = closed_port()
    if backend.name == "s3":
        return backend.url, {**backend.options, "endpoint_url": f"http://127.0.0.1:{port}"}
    if backend.name == "gcs":
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
        return backend.url, backend.options
    if backend.name == "azure":
        text = str(backend.options["connection_string"])
        return backend.url, {
            "connection_string": ";".join(
                f"BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1"
                if part.startswith("BlobEndpoint=")
                else part
                for part in text.split(";")
            )
        }
    return f"oci://127.0.0.1:{port}/{backend.url.split('/', 3)[3]}", {}


@only(*REMOTE)
def test_an_unreachable_endpoint_is_a_store_error_within_the_deadline(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every operation's failure is typed, and its retries end by the deadline: on the
    injectable clock, so the pauses taken are counted, not timed."""
    url, options = unreachable(backend, monkeypatch)
    store = open_store(url, options, 5.0)
    for operation in (
        lambda deadline: raw(store.fetch(FP, deadline)),
        store.list_objects,
        lambda deadline: store.put(FP, b"plan", None, deadline),
        lambda deadline: store.delete([FP], deadline),
    ):
        clock = FakeClock()
        with pytest.raises(StoreError) as err:
            operation(Deadline.after(5.0, clock))
        assert err.value.reason in (Reason.STORE_ERROR, Reason.TIMEOUT), err.value
        assert sum(clock.slept) <= 5.0  # every pause inside the budget


@only("azure", "oci")
def test_permission_denied_is_typed(
    backend: Backend,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the server checks credentials here (Azurite's account key, docker-registry's
    htpasswd; moto and the GCS emulator accept anyone): a refusal is a ``store-error``, never
    ``internal-error``, and names no secret."""
    if backend.name == "azure":
        text = str(backend.options["connection_string"])
        wrong = base64.b64encode(b"not-the-account-key" * 3).decode()
        options = {
            "connection_string": ";".join(
                f"AccountKey={wrong}" if p.startswith("AccountKey=") else p for p in text.split(";")
            )
        }
        store = open_store(backend.url, options, 10.0)
    else:
        monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))  # no ambient credentials
        monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
        tls: DockerRegistry = request.getfixturevalue("tls_registry")
        store = open_store(tls.url(tls.new_repository()), {"ca_file": str(tls.ca)}, 10.0)
    for operation in (
        lambda: raw(store.fetch(FP)),
        store.list_objects,
        lambda: store.put(FP, b"plan", None),
    ):
        with pytest.raises(PlanCacheError) as err:
            operation()
        assert err.value.reason is Reason.STORE_ERROR, err.value


# -- credentials --------------------------------------------------------------------------------


class _Recorder(BaseHTTPRequestHandler):
    """Records every request whole (line, headers, body) and refuses it (403)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.seen.append(  # type: ignore[attr-defined]  # set by LoopbackServer(seen=)
            f"{self.requestline}\n{self.headers}".encode("latin-1") + body
        )
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.send_header("Connection", "close")
        self.end_headers()

    do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _answer


@only("s3", "azure")
def test_a_secret_key_crosses_no_wire(backend: Backend) -> None:
    """S3 and Azure sign each request with the key (SigV4, Shared Key): whatever endpoint the
    options name, plain HTTP or not, the key itself is never sent, only a signature; a refusal
    (403) is a ``store-error``. A registry's credentials do travel (basic auth, a token
    service): they go only over TLS or loopback, to the registry's own host or a listed realm
    (tests/test_store_oci_realms.py, hostile stubs on other hosts in a network namespace). GCS's
    bearer token goes to Google's HTTPS endpoint unless the operator names an emulator
    (``STORAGE_EMULATOR_HOST``): the emulator here takes none (``token=anon``)."""
    recorder = LoopbackServer(_Recorder, seen=[])
    secret = f"not-a-real-secret-{uuid.uuid4().hex}"
    key = base64.b64encode(secret.encode()).decode()
    if backend.name == "s3":
        options = {**backend.options, "endpoint_url": recorder.endpoint, "secret": secret}
    else:
        text = str(backend.options["connection_string"])
        options = {
            "connection_string": ";".join(
                f"BlobEndpoint={recorder.endpoint}/devstoreaccount1"
                if p.startswith("BlobEndpoint=")
                else f"AccountKey={key}"
                if p.startswith("AccountKey=")
                else p
                for p in text.split(";")
            )
        }
    try:
        store = open_store(backend.url, options, 10.0)
        for operation in (
            lambda: raw(store.fetch(FP)),
            store.list_objects,
            lambda: store.put(FP, b"plan", b"sig"),
        ):
            with pytest.raises(PlanCacheError) as err:
                operation()
            assert err.value.reason is Reason.STORE_ERROR, err.value
            assert secret not in str(err.value) and key not in str(err.value)
        seen = recorder.httpd.seen
        assert any(b"\nAuthorization: " in r for r in seen)  # signed: the key was used
        assert not [r for r in seen if secret.encode() in r or key.encode() in r]
    finally:
        recorder.stop()


# -- where a read was served from -----------------------------------------------------------------


def test_a_read_names_no_mirror_unless_one_served_it(backend: Backend) -> None:
    """``via_mirror`` (the CLI's report, the plugin's log line) comes from the mirrors noted as
    read for the store: none for a read from the store's own origin, on every backend."""
    backend.store().put(FP, b"plan", b"sig")
    forget()
    assert raw(backend.store().fetch(FP)) == (b"plan", b"sig")
    assert backend.store().fingerprints() == [FP]
    assert mirrors_read(store_key(backend.url)) == [] and mirrors_read() == []


@only("oci")
def test_a_registry_read_through_its_mirror_names_the_mirror(backend: Backend) -> None:
    """The one backend with mirrors: a read through a pull-through mirror (another
    docker-registry in proxy mode) is noted for the store, with what configured it."""
    assert backend.registry is not None
    binary = registry_binary()
    assert binary is not None
    mirror = DockerRegistry(binary, remote=backend.registry.endpoint)
    try:
        backend.store().put(FP, b"plan", b"sig")
        forget()
        store = open_store(backend.url, {"mirror": f"http://{mirror.host}"}, 30.0)
        assert raw(store.fetch(FP)) == (b"plan", b"sig")
        noted = mirrors_read(store_key(backend.url))
        assert [host for host, _ in noted] == [mirror.host] and all(where for _, where in noted)
        assert mirror.settled_requests(r"^/v2/.+/manifests/")  # the mirror was asked
    finally:
        mirror.stop()
        forget()


@pytest.mark.parametrize(
    "backend",
    [
        *BACKENDS[:-1],
        pytest.param(
            "oci",
            marks=pytest.mark.xfail(
                strict=True,
                reason="a registry's folder listing names the archive of a cache of which only "
                "the signature was written (its manifest holds the signature layer alone), "
                "and a read of that name finds nothing: a listing names what is not there",
            ),
        ),
    ],
    indirect=True,
)
def test_a_compile_cache_folder_lists_its_entries_and_its_subfolders(backend: Backend) -> None:
    """The compile-cache folder's listing (``compile-cache pull``: which caches the store has)
    names the files directly in it and the folders below it, on every backend: S3, GCS and Azure
    list it page by page, capped (:func:`plancache.storage.listing.folder_listing`), the others
    as a directory; an absent folder lists nothing. Names a compile cache has (a registry holds
    no other)."""
    aot = "torch_aot_compile/" + "ab" * 32
    store = backend.store()
    assert store.folder_names("torch_compile_cache", Deadline.after(30.0)) == []
    store.write_object(archives.sig_name(SUBJECT), b"a", Deadline.after(30.0))
    store.write_object(archives.sig_name(aot), b"b", Deadline.after(30.0))
    assert sorted(store.folder_names("torch_compile_cache", Deadline.after(30.0))) == [
        f"{SUBJECT}.tar.sig",
        "torch_aot_compile",
    ]
    assert store.folder_names("torch_compile_cache/torch_aot_compile", Deadline.after(30.0)) == [
        aot.rpartition("/")[2] + ".tar.sig"
    ]
    assert archives.list_subjects(store) == sorted([SUBJECT, aot])
    assert archives.get_object(store, archives.archive_name(SUBJECT), 1024) is None
