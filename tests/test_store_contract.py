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
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
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
from store_servers import (
    GcsEmulator,
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


@only("s3", "gcs", "azure")
def test_a_listing_past_its_page_budget_is_too_large(
    backend: Backend, lowered_caps: Callable[..., None]
) -> None:
    """Only where the server pages as asked: a directory and ``memory://`` are one page, and
    docker-registry ignores ``?n=`` on its tag list (the page budget against a registry that
    pages without end: tests/test_store_oci_listings.py)."""
    store = backend.store()
    for fp in (FP, FP2, FP3):
        store.put(fp, plan_bytes(fp=fp), None)
    lowered_caps(PAGE_SIZE=1, MAX_PAGES=3)
    assert store.fingerprints() == [FP3, FP, FP2]  # three pages: within the budget
    lowered_caps(PAGE_SIZE=1, MAX_PAGES=2)
    with pytest.raises(Rejected) as err:
        store.fingerprints()
    assert err.value.reason is Reason.TOO_LARGE and "pages" in err.value.detail
