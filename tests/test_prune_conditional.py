"""prune's conditional deletes where only a stand-in, a fault server or a swapped delete can
show them; what every store must do is tests/test_store_contract.py's (unchanged objects
deleted, changed ones kept and reported ``changed``, the window between re-read and delete
closed by the precondition on S3, Azure and the registry, left on ``file://`` and ``memory://``).

Kept here, because each is one backend's or one server's: gcp-storage-emulator ignores
``ifGenerationMatch`` (and ``generation=`` on reads), so the GCS precondition is tested against
:class:`GcsStandIn`, a stand-in written here for exactly the calls made, and the emulator itself
is refused by the precondition check; :func:`test_without_the_precondition_the_window_is_real`
swaps a backend's conditional delete for an unconditional one (S3, Azure, the stand-in, the
registry) to show that the keeping in the contract's window tests is the precondition's
doing; the fault server forges version tokens, ignores
``If-Match`` and names objects three times in a listing, which no real server does on demand.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import pytest

from conftest import FP, plan_bytes
from plancache.storage import conditional_deletes
from plancache.storage.conditional_deletes import content_digest, delete_if_unchanged
from plancache.storage.store import Store, open_store
from plancache.trust.errors import PlanCacheError, Reason
from plancache.trust.plans.plan import (
    fingerprint_of_plan_name,
    fingerprint_of_sig_name,
    plan_name,
    sig_name,
)
from registry_server import DockerRegistry
from store_servers import (
    AWS_ENV,
    FaultObject,
    FaultServer,
    GcsEmulator,
    LoopbackServer,
    MotoServer,
    QuietHTTPServer,
    azurite,  # noqa: F401 - a fixture, named as a parameter
    fault_server,  # noqa: F401 - a fixture, named as a parameter
    fault_server_session,  # noqa: F401 - a fixture, named as a parameter
    gcs_emulator,  # noqa: F401 - a fixture, named as a parameter
    moto_server,  # noqa: F401 - a fixture, named as a parameter
    registry,  # noqa: F401 - a fixture, named as a parameter
)

FP2 = "fedcba9876543210"
FP3 = "00000000deadbeef"
SIG = b"sig-of-" + FP.encode()
NEW_PLAN = plan_bytes(kv=3 * 2**30)  # re-pushed meanwhile: other bytes
NEW_SIG = b"re-signed"

CONDITIONAL = ("s3", "azure", "gcs-standin", "oci")
"""Backends whose store holds the precondition here (the GCS emulator would ignore it)."""


# -- the GCS stand-in -------------------------------------------------------------------------


@dataclass
class StandInState:
    # bucket/key -> (bytes, generation)
    objects: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    # (method, path with query) of each
    requests: list[tuple[str, str]] = field(default_factory=list)
    generations: int = 1000
    lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self, name: str, data: bytes) -> None:
        with self.lock:
            self.generations += 1
            self.objects[name] = (data, self.generations)


class _StandInHandler(BaseHTTPRequestHandler):
    """A STAND-IN for GCS's JSON API, because gcp-storage-emulator does not implement
    ``ifGenerationMatch``: exactly the calls the conditional prune makes (a multipart upload of
    the precondition check's canary, object metadata, media read, optionally pinned with
    ``generation=``, delete, optionally with ``ifGenerationMatch``), answered as GCS documents them
    (404 absent, 412 condition not met, 416 for a range over an empty object)."""

    protocol_version = "HTTP/1.1"
    server: QuietHTTPServer

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        body = json.dumps({"error": {"code": status, "message": message}}).encode()
        self._send(status, body, {"Content-Type": "application/json"})

    def _target(self) -> tuple[str, str, dict[str, list[str]]] | None:
        """(kind, bucket/key, query) for ``/storage/v1/b/B/o/K`` (meta) or ``/download/...``
        (media)."""
        url = urlparse(self.path)
        parts = url.path.split("/")  # the key is one quoted segment: gcsfs quotes its slashes
        state = self.server.state
        with state.lock:
            state.requests.append((self.command, self.path))
        for prefix, kind in (
            (["", "storage", "v1", "b"], "meta"),
            (["", "download", "storage", "v1", "b"], "media"),
        ):
            n = len(prefix)
            if parts[:n] == prefix and len(parts) == n + 3 and parts[n + 1] == "o":
                return kind, f"{unquote(parts[n])}/{unquote(parts[n + 2])}", parse_qs(url.query)
        return None

    def _current(
        self, name: str, query: dict[str, list[str]], param: str
    ) -> tuple[bytes, int] | int:
        """The object, or the status to answer: 404 absent, 412 if ``param`` names another
        generation."""
        with self.server.state.lock:
            found = self.server.state.objects.get(name)
        if found is None:
            return 404
        wanted = query.get(param, [None])[0]
        if wanted is not None and int(wanted) != found[1]:
            # a pinned read of a replaced generation: gone
            return 404 if param == "generation" else 412
        return found

    def do_GET(self) -> None:
        target = self._target()
        if target is None:
            return self._error(501, "not part of the stand-in")
        kind, name, query = target
        found = self._current(name, query, "generation")
        if isinstance(found, int):
            return self._error(found, "No such object")
        data, generation = found
        if kind == "meta":
            bucket, key = name.split("/", 1)
            meta = {
                "kind": "storage#object",
                "bucket": bucket,
                "name": key,
                "generation": str(generation),
                "size": str(len(data)),
            }
            return self._send(200, json.dumps(meta).encode(), {"Content-Type": "application/json"})
        headers = {"x-goog-generation": str(generation)}
        rng = self.headers.get("Range", "")
        if not rng.startswith("bytes="):
            return self._send(200, data, headers)
        start, _, end = rng[6:].partition("-")
        if int(start) >= len(data):
            return self._error(416, "The requested range cannot be satisfied.")
        last = min(int(end), len(data) - 1)
        headers["Content-Range"] = f"bytes {start}-{last}/{len(data)}"
        return self._send(206, data[int(start) : last + 1], headers)

    def do_POST(self) -> None:
        """gcsfs's multipart upload (``pipe_file``: the precondition check's canary)."""
        url = urlparse(self.path)
        parts = url.path.split("/")
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.state.lock:
            self.server.state.requests.append(("POST", self.path))
        if parts[:5] != ["", "upload", "storage", "v1", "b"] or len(parts) != 7 or parts[6] != "o":
            return self._error(501, "not part of the stand-in")
        _head, _, rest = body.partition(b"\n\n")
        meta_text, _, rest = rest.partition(b"\n--==0==")
        data = rest.partition(b"\n\n")[2].removesuffix(b"\n--==0==--")
        bucket, key = unquote(parts[5]), json.loads(meta_text)["name"]
        self.server.state.write(f"{bucket}/{key}", data)
        generation = self.server.state.objects[f"{bucket}/{key}"][1]
        meta = {
            "kind": "storage#object",
            "bucket": bucket,
            "name": key,
            "generation": str(generation),
            "size": str(len(data)),
        }
        return self._send(200, json.dumps(meta).encode(), {"Content-Type": "application/json"})

    def do_DELETE(self) -> None:
        target = self._target()
        if target is None or target[0] != "meta":
            return self._error(501, "not part of the stand-in")
        _, name, query = target
        found = self._current(name, query, "ifGenerationMatch")
        if isinstance(found, int):
            return self._error(found, "No such object" if found == 404 else "conditionNotMet")
        with self.server.state.lock:
            del self.server.state.objects[name]
        self._send(204)
        return None


class GcsStandIn(LoopbackServer):
    """The stand-in on a free loopback port (see :class:`_StandInHandler`)."""

    def __init__(self) -> None:
        super().__init__(_StandInHandler, state=StandInState())

    @property
    def state(self) -> StandInState:
        return self.httpd.state


# -- backends -------------------------------------------------------------------------------------


@dataclass
class Backend:
    name: str
    store: Store
    standin: GcsStandIn | None = None

    def write(self, name: str, data: bytes) -> None:
        """Write behind the prune's back (another operator's push)."""
        if self.name == "oci":  # a registry is no filesystem: through another store
            open_store(self.store.url, None, 30).put_many({name: data})
            return None
        if self.standin is not None:
            return self.standin.state.write(self.store.path(name), data)
        self.store.open_backend().fs.pipe_file(self.store.path(name), data)
        return None

    def remove(self, name: str) -> None:
        if self.standin is not None:
            with self.standin.state.lock:
                del self.standin.state.objects[self.store.path(name)]
            return
        self.store.open_backend().fs.rm_file(self.store.path(name))

    def read(self, name: str) -> bytes | None:
        if self.name == "oci":
            fp = fingerprint_of_plan_name(name) or fingerprint_of_sig_name(name)
            assert fp is not None
            got = open_store(self.store.url, None, 30).fetch(fp)
            return got.sig_bytes if name.endswith(".sig") else got.plan_bytes
        if self.standin is not None:
            found = self.standin.state.objects.get(self.store.path(name))
            return None if found is None else found[0]
        try:
            return bytes(self.store.open_backend().fs.cat_file(self.store.path(name)))
        except FileNotFoundError:
            return None


@pytest.fixture(params=["s3", "azure", "gcs", "gcs-standin", "oci"])
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Backend]:
    kind = request.param
    if kind == "s3":
        moto: MotoServer = request.getfixturevalue("moto_server")
        yield Backend(kind, open_store(f"s3://{moto.new_bucket()}/team/plans", moto.options, 30))
    elif kind == "azure":
        server = request.getfixturevalue("azurite")
        yield Backend(
            kind, open_store(f"az://{server.new_container()}/team/plans", server.options, 30)
        )
    elif kind == "gcs":
        gcs: GcsEmulator = request.getfixturevalue("gcs_emulator")
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
        yield Backend(kind, open_store(f"gs://{gcs.new_bucket()}/plans", {"token": "anon"}, 30))
    elif kind == "oci":
        server: DockerRegistry = request.getfixturevalue("registry")
        yield Backend(kind, open_store(server.url(server.new_repository()), None, 30))
    else:
        standin = GcsStandIn()
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", standin.endpoint)
        try:
            yield Backend(
                kind, open_store("gs://standin/team/plans", {"token": "anon"}, 30), standin
            )
        finally:
            standin.stop()


def seed(backend: Backend) -> dict[str, str]:
    """FP signed, FP2 with an empty sidecar (a 416 to a ranged read), FP3 unsigned; their
    digests."""
    plans = {
        FP: (plan_bytes(), SIG),
        FP2: (plan_bytes(fp=FP2), b""),
        FP3: (plan_bytes(fp=FP3), None),
    }
    for fp, (plan, sig) in plans.items():
        backend.write(plan_name(fp), plan)
        if sig is not None:
            backend.write(sig_name(fp), sig)
    return {fp: content_digest(plan, sig) for fp, (plan, sig) in plans.items()}


def prune(backend: Backend, judged: dict[str, str], **kwargs: Any) -> tuple[list[str], list[str]]:
    """:func:`delete_if_unchanged`; on gcp-storage-emulator, which ignores the precondition (so the
    check refuses it: :func:`test_the_gcs_emulator_ignores_if_generation_match_and_is_refused`),
    unconditionally, as ``prune --unconditional`` would."""
    return delete_if_unchanged(backend.store, judged, unconditional=backend.name == "gcs", **kwargs)


def names(fp: str) -> tuple[str, str]:
    return plan_name(fp), sig_name(fp)


# -- (a) unchanged: deleted ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["gcs-standin"], indirect=True)
def test_unchanged_objects_are_deleted_on_their_generation(backend: Backend) -> None:
    """On every backend: tests/test_store_contract.py. Here what only the stand-in can show:
    each object re-read pinned to its generation, and deleted on it."""
    judged = seed(backend)
    deleted, changed = prune(backend, judged)
    assert deleted == [FP, FP2, FP3] and changed == []
    assert all(backend.read(n) is None for fp in judged for n in names(fp))
    if backend.standin is not None:
        requests = backend.standin.state.requests
        media = [p for m, p in requests if m == "GET" and "alt=media" in p and "startup_plan_" in p]
        deletes = [p for m, p in requests if m == "DELETE" and "startup_plan_" in p]
        canary = [p for m, p in requests if m == "DELETE" and ".plancache-precondition-check-" in p]
        # the wrong one (412), then the cleanup
        assert len(canary) == 2 and "ifGenerationMatch=" in canary[0]
        assert not any(
            ".plancache-precondition-check-" in name for name in backend.standin.state.objects
        )
        # the empty sidecar: 416, then whole
        assert len(media) == 6 and all("generation=" in p for p in media)
        assert len(deletes) == 5 and all("ifGenerationMatch=" in p for p in deletes)


# -- (b) replaced between the re-read and the delete: kept by the precondition ---------------------


def replace_in_window(
    backend: Backend, name: str, data: bytes
) -> tuple[list[list[str]], Callable[[list[str]], None]]:
    """A ``before_delete`` hook that rewrites ``name``, and the list of the fingerprints it was
    called with."""
    calls: list[list[str]] = []

    def hook(fps: list[str]) -> None:
        calls.append(list(fps))
        backend.write(name, data)

    return calls, hook


@pytest.mark.parametrize("backend", ["gcs-standin"], indirect=True)
def test_plan_replaced_after_the_reread_is_kept_with_its_sidecar(backend: Backend) -> None:
    judged = seed(backend)
    calls, hook = replace_in_window(backend, plan_name(FP), NEW_PLAN)
    deleted, changed = delete_if_unchanged(backend.store, judged, before_delete=hook)
    assert calls == [[FP, FP2, FP3]]  # the hook ran after the re-read found all three unchanged
    assert changed == [FP] and deleted == [FP2, FP3]  # reported as changed, not as an error
    assert backend.read(plan_name(FP)) == NEW_PLAN and backend.read(sig_name(FP)) == SIG
    assert all(backend.read(n) is None for fp in (FP2, FP3) for n in names(fp))


@pytest.mark.parametrize("backend", ["gcs-standin"], indirect=True)
def test_sidecar_replaced_after_the_reread_is_kept(backend: Backend) -> None:
    judged = seed(backend)
    _, hook = replace_in_window(backend, sig_name(FP), NEW_SIG)
    deleted, changed = delete_if_unchanged(backend.store, judged, before_delete=hook)
    assert deleted == [FP, FP2, FP3] and changed == []  # the plan was still the judged one: gone
    assert backend.read(plan_name(FP)) is None and backend.read(sig_name(FP)) == NEW_SIG


@pytest.mark.parametrize("backend", CONDITIONAL, indirect=True)
def test_without_the_precondition_the_window_is_real(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race with the delete made unconditional: the check before the first delete
    refuses such a store; with the check skipped, the race deletes the re-pushed plan. What
    keeps it in the tests above is the store's precondition, not the timing."""
    store_backend = backend.store.backend

    async def unconditional(path: str, token: str) -> None:
        await store_backend.delete(path)

    monkeypatch.setattr(store_backend, "delete_if_unchanged", unconditional)
    judged = seed(backend)
    _, hook = replace_in_window(backend, plan_name(FP), NEW_PLAN)
    with pytest.raises(PlanCacheError) as info:  # the check before the first delete sees it
        delete_if_unchanged(backend.store, judged, before_delete=hook)
    assert info.value.reason is Reason.CONFIG and "--unconditional" in info.value.detail
    assert backend.read(plan_name(FP)) == plan_bytes()  # nothing judged was deleted
    monkeypatch.setattr(
        conditional_deletes, "require_honoured_preconditions", lambda store, deadline: None
    )
    deleted, changed = delete_if_unchanged(backend.store, judged, before_delete=hook)
    assert deleted == [FP, FP2, FP3] and changed == [] and backend.read(plan_name(FP)) is None


# -- (c) gone before the delete: fine --------------------------------------------------------------


@pytest.mark.parametrize(
    "etag",
    [None, "", "x" * 300, '"a\x01b"', '"caf\u00e9"'],
    ids=["absent", "empty", "overlong", "control", "non-ascii"],
)
def test_a_version_the_store_forged_or_left_out_deletes_nothing(
    etag: str | None, fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The version token goes back to the store in a header: one that is absent, empty, overlong
    or not printable ASCII is a store error, and no delete is sent unconditionally instead."""
    for name, value in AWS_ENV.items():
        monkeypatch.setenv(name, value)
    for name in (plan_name(FP), sig_name(FP)):
        fault_server.state.objects[f"plans/{name}"] = FaultObject(
            b"{}" if name.endswith(".sig") else plan_bytes()
        )
    fault_server.state.etag = etag
    store = open_store("s3://faulty/plans", {"endpoint_url": fault_server.endpoint}, 5.0)
    judged = store.fetch(FP)
    with pytest.raises(PlanCacheError) as info:
        delete_if_unchanged(store, {FP: content_digest(judged.plan_bytes, judged.sig_bytes)})
    assert info.value.reason is Reason.STORE_ERROR, info.value
    assert _plan_deletes(fault_server) == []  # (the precondition check's canary is not a plan)
    assert store.fingerprints() == [FP]


# -- (d) a store that ignores the precondition: refused before anything is deleted ----------------


def _faulty_store(
    fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch, listed: int = 1
) -> list[str]:
    """Three unsigned plans on the fault server (which ignores ``If-Match`` on DELETE), each
    named ``listed`` times by its listing; the CLI arguments that reach it."""
    for name, value in AWS_ENV.items():
        monkeypatch.setenv(name, value)
    keys = [f"plans/{plan_name(fp)}" for fp in (FP, FP2, FP3)]
    for key, fp in zip(keys, (FP, FP2, FP3), strict=True):
        fault_server.state.objects[key] = FaultObject(plan_bytes(fp=fp))
    fault_server.state.listing = [k for k in keys for _ in range(listed)]
    return ["--storage-option", f"endpoint_url={fault_server.endpoint}", "s3://faulty/plans"]


def _plan_deletes(fault_server: FaultServer) -> list[str]:
    return [p for m, p, _ in fault_server.state.requests if m == "DELETE" and "startup_plan_" in p]


def test_a_store_that_ignores_if_match_is_refused_before_any_delete(
    fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fault server deletes whatever a DELETE names, ``If-Match`` or not (as several
    S3-compatible servers do): prune finds out on a canary first, deletes nothing, and says
    which flag prunes anyway; with that flag it deletes after the re-read."""
    from plancache.cli.main import main

    where = _faulty_store(fault_server, monkeypatch)
    code = main(["prune", "--unsigned", *where])
    out, err = capsys.readouterr()
    assert (
        code == 2
        and err.count("\n") == 1
        and "--unconditional" in err
        and "conditional deletes" in err
    ), err
    # the canary is gone too
    assert _plan_deletes(fault_server) == [] and len(fault_server.state.objects) == 3
    canary = [p for m, p, _ in fault_server.state.requests if m == "PUT"]
    assert len(canary) == 1 and ".plancache-precondition-check-" in canary[0]
    code = main(["prune", "--unsigned", "--unconditional", "--json", *where])
    out, _ = capsys.readouterr()
    assert code == 0 and sorted(d["fingerprint"] for d in json.loads(out)["deleted"]) == sorted(
        [FP, FP2, FP3]
    )
    # plans and sidecars
    assert len(_plan_deletes(fault_server)) == 6 and fault_server.state.objects == {}


@pytest.mark.parametrize("backend", ["gcs"], indirect=True)
def test_the_gcs_emulator_ignores_if_generation_match_and_is_refused(backend: Backend) -> None:
    """gcp-storage-emulator is such a store (it ignores ``ifGenerationMatch``): a real server
    for which the check refuses; nothing judged is deleted."""
    judged = seed(backend)
    with pytest.raises(PlanCacheError) as info:
        delete_if_unchanged(backend.store, judged)
    assert info.value.reason is Reason.CONFIG and "--unconditional" in info.value.detail
    assert all(backend.read(plan_name(fp)) is not None for fp in judged)
    assert backend.store.open_backend().fs.ls(backend.store.root) != [] and not any(
        ".plancache-precondition-check-" in p
        for p in backend.store.open_backend().fs.ls(backend.store.root)
    )


def test_a_listing_that_names_each_object_three_times_counts_each_once(
    fault_server: FaultServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """Three plans, each listed three times: verify, ls and pull see three plans, and prune
    reports three deletions (not nine)."""
    from plancache.cli.main import main
    from plancache.keys.keyfile import generate_keypair

    where = _faulty_store(fault_server, monkeypatch, listed=3)
    generate_keypair(tmp_path / "k", force=False, comment="k")
    keys = ["--trusted-keys", f"{tmp_path / 'k'}.pub"]
    for command in (["verify", *keys], ["ls"]):
        main([*command, "--json", *where])
        assert len(json.loads(capsys.readouterr().out)["plans"]) == 3, command
    main(["pull", *keys, "--json", *where, str(tmp_path / "pulled")])
    assert len(json.loads(capsys.readouterr().out)["plans"]) == 3
    code = main(["prune", "--unsigned", "--unconditional", "--json", *where])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and len(doc["deleted"]) == 3 and doc["kept"] == 0, doc
    assert len(_plan_deletes(fault_server)) == 6
