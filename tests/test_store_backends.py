"""The store on every backend: file://, memory://, S3 (moto server over HTTP), GCS (emulator),
Azure Blob (Azurite over HTTP).

The same behaviour is asked of each: round trips, one fetch for plan and sidecar, capped
reads, hostile names ignored, deletes, and the whole CLI journey (push, pull, verify, ls,
prune) with tampering in the store rejected and nothing unverified written locally.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from conftest import FP, GIB, plan_bytes, raw
from plancache.cli.main import main
from plancache.clock import Deadline
from plancache.keys.schemes import load_signer
from plancache.pipeline.resolver import utcnow
from plancache.storage.local.localdir import LocalPlanDir
from plancache.storage.store import Store, open_store
from plancache.trust.errors import PlanCacheError, Reason
from plancache.trust.plans.plan import MAX_PLAN_BYTES, plan_name, sig_name
from plancache.trust.signing import sign_plan
from store_servers import (
    GcsEmulator,
    MotoServer,
    azurite,  # noqa: F401 - a fixture, named as a parameter
    gcs_emulator,  # noqa: F401 - a fixture, named as a parameter
    moto_server,  # noqa: F401 - a fixture, named as a parameter
)

FP2 = "fedcba9876543210"
FP3 = "00000000deadbeef"


@dataclass
class Backend:
    name: str
    url: str
    options: dict[str, Any] = field(default_factory=dict)

    def store(self, timeout: float = 30.0) -> Store:
        return open_store(self.url, self.options, timeout)

    def cli_options(self) -> list[str]:
        return [
            x for k, v in self.options.items() for x in ("--storage-option", f"{k}={json.dumps(v)}")
        ]

    def plant(self, name: str, data: bytes) -> None:
        """Write an object behind the store's back (a hostile or careless bucket writer)."""
        store = self.store()
        store.open_backend().fs.pipe_file(store.path(name), data)


@pytest.fixture(params=["file", "memory", "s3", "gcs", "azure"])
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
    else:
        gcs: GcsEmulator = request.getfixturevalue("gcs_emulator")
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
        yield Backend(kind, f"gs://{gcs.new_bucket()}/plans", {"token": "anon"})


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_round_trip_fetch_list_delete(backend: Backend) -> None:
    store = backend.store()
    assert store.fingerprints() == []
    assert raw(store.fetch(FP)) == (None, None)
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
    assert listing[plan_name(FP)].size == len(b"plan-bytes")
    store.delete([FP, FP3])
    assert store.fingerprints() == [FP2]


def test_an_empty_sidecar_reads_as_empty_everywhere(backend: Backend) -> None:
    """A range over an empty object is 416 on S3, GCS and Azure: read as empty bytes on every
    backend (and on S3 through both read paths), so the verifier, not the store, rejects it."""
    backend.plant(plan_name(FP), b"plan-bytes")
    backend.plant(sig_name(FP), b"")
    assert raw(backend.store().fetch(FP)) == (b"plan-bytes", b"")
    built = backend.store()
    built.open_backend()  # s3fs built: the bulk read path
    assert raw(built.fetch(FP)) == (b"plan-bytes", b"")


def test_oversized_objects_are_refused_not_downloaded(backend: Backend) -> None:
    backend.plant(plan_name(FP), b"{" + b" " * (MAX_PLAN_BYTES + 1000) + b"}")
    with pytest.raises(PlanCacheError) as err:
        raw(backend.store().fetch(FP))
    assert err.value.reason is Reason.TOO_LARGE
    [result] = backend.store().fetch_many([FP])
    assert result.error is not None and result.error.reason is Reason.TOO_LARGE


def test_hostile_names_in_a_listing_are_ignored(backend: Backend) -> None:
    for name in (
        "startup_plan_0123456789ABCDEF.json",  # upper case
        "startup_plan_0123456789abcde.json",  # 15 hex
        "startup_plan_0123456789abcdef.json.tmp",
        "startup_plan_0123456789abcdef.jsonx",
        "sub/startup_plan_fedcba9876543210.json",  # one level down
        "..startup_plan_fedcba9876543210.json",
    ):
        backend.plant(name, b"x")
    backend.plant(plan_name(FP3), b"ok")
    assert backend.store().fingerprints() == [FP3]


def test_invalid_fingerprints_never_reach_the_store(backend: Backend) -> None:
    store = backend.store()
    for bad in ("../../etc/passwd", "0123456789ABCDEF", "0123"):
        with pytest.raises(PlanCacheError) as err:
            raw(store.fetch(bad))
        assert err.value.reason is Reason.MALFORMED


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
    backend.plant(plan_name(FP2), plan_bytes(fp=FP2, kv=2 * GIB - 1, baseline=2 * GIB))
    backend.plant(sig_name(FP), b"{}")
    backend.plant(plan_name(FP3), plan_bytes(fp=FP3))
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


def test_empty_object_reads_as_empty(backend: Backend) -> None:
    # S3 answers a byte range over an empty object with 416; it is still just empty
    backend.plant(plan_name(FP), b"")
    assert raw(backend.store().fetch(FP)) == (b"", None)


def test_missing_locations_fail_and_empty_ones_say_so(
    backend: Backend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo in the bucket (or directory) is exit 2 on every backend; an empty prefix fails
    verify."""
    opts = backend.cli_options()
    run(capsys, "keygen", str(tmp_path / "k"))
    keys = ["--trusted-keys", str(tmp_path / "k.pub")]
    scheme, _rest = backend.url.split("://", 1)
    missing = f"{scheme}://{'/' if scheme == 'file' else ''}no-such-{uuid.uuid4().hex[:8]}/plans"
    code, out, err = run(capsys, "verify", *keys, *opts, missing)
    assert code == 2 and "does not exist" in err and out == ""
    backend.plant(plan_name(FP), plan_bytes())  # makes the bucket's prefix exist
    empty = backend.url.rsplit("/", 1)[0] + "/empty"
    if backend.name in ("file", "memory"):  # no buckets: the directory itself must exist
        store = open_store(empty, backend.options, 30)
        assert run(capsys, "verify", *keys, *opts, empty)[0] == 2
        store.open_backend().fs.makedirs(store.root, exist_ok=True)
    code, _, err = run(capsys, "verify", *keys, *opts, empty)
    assert code == 1 and f"no plans in {empty}" in err
    assert run(capsys, "verify", "--allow-empty", *keys, *opts, empty)[0] == 0


def test_an_empty_prefix_names_the_deeper_prefixes_that_hold_plans(
    backend: Backend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The walk below an empty prefix, page by page on S3, GCS and Azure (sub-prefixes from the
    listing's CommonPrefixes / prefixes / blob prefixes), a directory walk elsewhere."""
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


def test_a_compile_cache_folder_lists_its_entries_and_its_subfolders(backend: Backend) -> None:
    """The compile-cache folder's listing (``compile-cache pull``: which caches the store has)
    names the files directly in it and the folders below it, on every backend: S3, GCS and Azure
    list it page by page, capped (:func:`plancache.storage.listing.folder_listing`), the others
    as a directory; an absent folder lists nothing."""
    store = backend.store()
    assert store.folder_names("torch_compile_cache", Deadline.after(30.0)) == []
    store.write_object("torch_compile_cache/a.tar.sig", b"a", Deadline.after(30.0))
    store.write_object(
        "torch_compile_cache/torch_aot_compile/b.tar.sig", b"b", Deadline.after(30.0)
    )
    assert sorted(store.folder_names("torch_compile_cache", Deadline.after(30.0))) == [
        "a.tar.sig",
        "torch_aot_compile",
    ]
    assert store.folder_names("torch_compile_cache/torch_aot_compile", Deadline.after(30.0)) == [
        "b.tar.sig"
    ]
