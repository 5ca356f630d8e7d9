"""A node's plan-set read never makes a boot worse (issue 40), over a real loopback S3 server.

The server answers as S3 does to a reader that may ``GetObject`` but not ``ListBucket`` (the usual
node policy): ``403 AccessDenied`` for a missing object, never 404. Against it, through botocore
and s3fs over HTTP: no set pushed, a replica above those pushed, a set over the cap and a set
read that keeps failing each fall back (to the set, then to the per-plan objects) within the same
deadline; ranks of different sets never wait on each other's fetch (one lock per set name);
a set only fills gaps (a rank's newer valid local plan stays); and an outcome file holding NaN,
1e999, deep nesting or a time in the future is no record at all.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest

from conftest import NOW, keyring_of, make_signer
from plancache.clock import Deadline
from plancache.pipeline.plan_sets import node_plans
from plancache.pipeline.plan_sets.node_plans import outcome_path, resolve_node, set_key
from plancache.pipeline.resolver import Resolver
from plancache.storage.local.directory_lock import locked
from plancache.storage.local.localdir import LocalPlanDir
from plancache.storage.store import Store, open_store
from plancache.trust.plans.plan import Plan, plan_name, render_plan, sig_name
from plancache.trust.plans.plan_set import MAX_SET_BYTES, build_set
from plancache.trust.plans.plan_set_names import replica_name
from plancache.trust.policy import TrustPolicy
from plancache.trust.result import PlanResult
from plancache.trust.signing import sign_plan
from store_servers import (
    AWS_ENV,
    FaultObject,
    FaultState,
    LoopbackServer,
    _FaultHandler,
    s3_read_path,  # noqa: F401 - a fixture, named as a parameter
)

BUCKET, PREFIX = "fleet", "plans"
WORLD = [f"{0x40_0000 + r:016x}" for r in range(4)]
OTHER = [f"{0x41_0000 + r:016x}" for r in range(2)]
BUDGET = 30.0
"""Generous: these tests check what was read and decided, not how fast (a shared machine)."""

DENIED = (
    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code>"
    b"<Message>Access Denied</Message></Error>"
)


class _Denying(_FaultHandler):
    """S3 to a reader without ``ListBucket``: 403 for a missing key and for a listing. A key in
    ``server.holds`` is answered only once its event is set (a set fetch held slow)."""

    def do_GET(self) -> None:
        parts = unquote(urlparse(self.path).path).lstrip("/").split("/", 1)
        key = parts[1] if len(parts) == 2 else ""
        hold = self.server.holds.get(key)
        if hold is not None:
            self.server.held.append(key)
            hold.wait(60)
        if not key or key not in self.server.state.objects:
            with self.server.state.lock:
                self.server.state.requests.append(("GET", self.path, self._range()))
            return self._send(403, DENIED, {"Content-Type": "application/xml"})
        return super().do_GET()


@pytest.fixture(scope="module")
def denying_server() -> Iterator[LoopbackServer]:
    server = LoopbackServer(_Denying, state=FaultState(), holds={}, held=[])
    server.httpd.endpoint = server.endpoint
    yield server
    server.stop()


@pytest.fixture
def s3(denying_server: LoopbackServer, monkeypatch: pytest.MonkeyPatch) -> LoopbackServer:
    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    denying_server.httpd.state = FaultState()
    denying_server.httpd.holds = {}
    denying_server.httpd.held = []
    return denying_server


def store_of(server: LoopbackServer) -> Store:
    """One rank's own store client (ranks are processes: nothing shared)."""
    return open_store(f"s3://{BUCKET}/{PREFIX}", {"endpoint_url": server.endpoint}, BUDGET)


def signed_world(
    signer: Any, world: list[str], when: datetime, *, kv: int = 20 << 30
) -> list[tuple[str, bytes, bytes]]:
    out = []
    for rank, fp in enumerate(world):
        data = render_plan(Plan(fp, kv, 70 << 30))
        out.append(
            (
                fp,
                data,
                sign_plan(
                    plan_name(fp),
                    data,
                    signer,
                    when,
                    provenance={"rank": rank, "world_size": len(world)},
                ),
            )
        )
    return out


def serve(
    server: LoopbackServer,
    members: list[tuple[str, bytes, bytes]],
    signer: Any,
    *,
    plans: bool = True,
    with_set: bool = True,
) -> str:
    """Put the per-plan objects and the set on the server; the set's name."""
    objects = server.httpd.state.objects
    if plans:
        for fp, plan, sig in members:
            objects[f"{PREFIX}/{plan_name(fp)}"] = FaultObject(plan)
            objects[f"{PREFIX}/{sig_name(fp)}"] = FaultObject(sig)
    name, data = build_set(members, signer, NOW - timedelta(hours=1))
    if with_set:
        objects[f"{PREFIX}/{name}"] = FaultObject(data)
    return name


def gets(server: LoopbackServer) -> list[tuple[str, int]]:
    """(object name, times asked) of every GET so far, in first-asked order."""
    counts: dict[str, int] = {}
    for method, path, _ in list(server.httpd.state.requests):
        if method == "GET":
            name = unquote(urlparse(path).path).rsplit("/", 1)[-1]
            counts[name] = counts.get(name, 0) + 1
    return list(counts.items())


def node(tmp_path: Path, label: str = "node") -> LocalPlanDir:
    return LocalPlanDir(tmp_path / label / "vllm" / "startup_plan")


def resolver(directory: LocalPlanDir, keyring: Any, server: LoopbackServer) -> Resolver:
    return Resolver(directory, TrustPolicy.signed(keyring), store_of(server), clock=lambda: NOW)


def boot(
    directory: LocalPlanDir,
    keyring: Any,
    server: LoopbackServer,
    fp: str,
    world: list[str],
    *,
    replica: int = 0,
    budget: float = BUDGET,
) -> PlanResult:
    return resolve_node(
        resolver(directory, keyring, server), fp, world, Deadline.after(budget), replica=replica
    )


# -- 1. a set never makes a boot worse -------------------------------------------------------------


def test_no_set_under_403_reads_the_per_plan_objects(
    s3_read_path: str, s3: LoopbackServer, tmp_path: Path
) -> None:
    """A store pushed without a key: the set's GET is a 403, and every rank's plan is still read."""
    signer = make_signer()
    name = serve(s3, signed_world(signer, WORLD, NOW - timedelta(hours=1)), signer, with_set=False)
    directory = node(tmp_path)
    result = boot(directory, keyring_of(signer), s3, WORLD[2], WORLD)
    assert result.verified is not None and result.error is None, result
    assert "plan set unread (store-error" in result.note and "AccessDenied" in result.note
    assert directory.fingerprints() == sorted(WORLD)
    asked = dict(gets(s3))
    assert asked[name] >= 1 and all(
        asked[plan_name(fp)] == 1 and asked[sig_name(fp)] == 1 for fp in WORLD
    )
    for fp in WORLD:  # the other ranks: local hits, no request
        before = len(s3.httpd.state.requests)
        assert boot(directory, keyring_of(signer), s3, fp, WORLD).source == "local"
        assert len(s3.httpd.state.requests) == before


def test_a_replica_above_those_pushed_reads_the_set_then_the_plans(
    s3: LoopbackServer, tmp_path: Path
) -> None:
    signer = make_signer()
    members = signed_world(signer, WORLD, NOW - timedelta(hours=1))
    # the set, no replica: PLANCACHE_SET_REPLICAS above those pushed
    name = serve(s3, members, signer)
    first = node(tmp_path, "a")
    result = boot(first, keyring_of(signer), s3, WORLD[0], WORLD, replica=3)
    assert result.verified is not None and "plan set replica 3 unread" in result.note, result
    assert [n for n, _ in gets(s3)] == [replica_name(name, 3), name]  # no per-plan object read
    assert first.fingerprints() == sorted(WORLD)

    del s3.httpd.state.objects[f"{PREFIX}/{name}"]  # neither copy: the per-plan objects
    s3.httpd.state.requests.clear()
    second = node(tmp_path, "b")
    result = boot(second, keyring_of(signer), s3, WORLD[1], WORLD, replica=3)
    assert result.verified is not None and "per-plan objects read" in result.note, result
    assert second.fingerprints() == sorted(WORLD)
    assert {n for n, _ in gets(s3)} == {replica_name(name, 3), name} | {
        f(fp) for fp in WORLD for f in (plan_name, sig_name)
    }


def test_a_set_over_the_cap_falls_back_to_the_per_plan_objects(
    s3: LoopbackServer, tmp_path: Path
) -> None:
    signer = make_signer()
    name = serve(s3, signed_world(signer, WORLD, NOW - timedelta(hours=1)), signer)
    s3.httpd.state.objects[f"{PREFIX}/{name}"] = FaultObject(b"x" * (MAX_SET_BYTES + 10))
    directory = node(tmp_path)
    result = boot(directory, keyring_of(signer), s3, WORLD[3], WORLD)
    assert result.verified is not None and "plan set rejected (too-large" in result.note, result
    assert directory.fingerprints() == sorted(WORLD)


def test_a_set_read_that_keeps_failing_falls_back_within_the_budget(
    s3: LoopbackServer, tmp_path: Path
) -> None:
    """A transient failure (500 on every try) with budget left: the per-plan objects, same
    deadline."""
    signer = make_signer()
    name = serve(s3, signed_world(signer, WORLD, NOW - timedelta(hours=1)), signer)
    s3.httpd.state.objects[f"{PREFIX}/{name}"].mode = "error500"
    directory = node(tmp_path)
    result = boot(directory, keyring_of(signer), s3, WORLD[0], WORLD)
    assert result.verified is not None and "plan set unread (store-error" in result.note, result
    assert dict(gets(s3))[name] >= 2 and directory.fingerprints() == sorted(WORLD)


# -- 2. ranks never wait on a fetch that is not theirs ---------------------------------------------


def test_ranks_of_different_sets_do_not_serialise(s3: LoopbackServer, tmp_path: Path) -> None:
    """Two worlds on one node (as ranks that fell back to their own one-member sets): world A's
    set read is held at the server; world B's rank reads its own set meanwhile."""
    signer = make_signer()
    keyring = keyring_of(signer)
    name_a = serve(s3, signed_world(signer, WORLD, NOW - timedelta(hours=1)), signer)
    name_b = serve(s3, signed_world(signer, OTHER, NOW - timedelta(hours=1)), signer)
    release = threading.Event()
    s3.httpd.holds[f"{PREFIX}/{name_a}"] = release
    directory = node(tmp_path)
    outcome: dict[str, PlanResult] = {}
    rank_a = threading.Thread(
        target=lambda: outcome.setdefault(
            "a", boot(directory, keyring, s3, WORLD[0], WORLD, budget=60)
        )
    )
    rank_a.start()
    try:
        until = time.monotonic() + 30
        while f"{PREFIX}/{name_a}" not in s3.httpd.held:
            assert time.monotonic() < until, "rank A never asked for its set"
            time.sleep(0.02)
        result = boot(directory, keyring, s3, OTHER[1], OTHER, budget=20)  # A's fetch still held
        assert not release.is_set() and result.verified is not None and result.error is None, result
        assert sorted(directory.fingerprints()) == sorted(OTHER)
    finally:
        release.set()
        rank_a.join(60)
    assert outcome["a"].verified is not None and sorted(directory.fingerprints()) == sorted(
        WORLD + OTHER
    )
    assert (
        outcome_path(directory.path, name_a).exists()
        and outcome_path(directory.path, name_b).exists()
    )


# -- 3. a set only fills gaps ----------------------------------------------------------------------


def test_a_newer_local_plan_survives_another_ranks_set_fetch(
    s3: LoopbackServer, tmp_path: Path
) -> None:
    signer = make_signer()
    keyring = keyring_of(signer)
    serve(s3, signed_world(signer, WORLD, NOW - timedelta(hours=2)), signer)
    directory = node(tmp_path)
    directory.path.mkdir(parents=True)
    newer = signed_world(signer, WORLD, NOW - timedelta(minutes=10), kv=10 << 30)
    _, plan_b, sig_b = newer[1]
    directory.write(WORLD[1], plan_b, sig_b)  # rank B profiled and saved since the set was pushed
    directory.write(WORLD[3], b"{not a plan", sig_b)  # rank D's local copy does not verify
    result = boot(directory, keyring, s3, WORLD[0], WORLD)  # rank A's miss reads the set
    assert result.verified is not None and "plan set" in result.note
    # B's newer plan stays, for this boot and the next
    assert directory.read(WORLD[1]) == (plan_b, sig_b)
    assert (
        resolver(directory, keyring, s3).local(WORLD[1]).verified.plan.kv_cache_memory_bytes
        == 10 << 30
    )
    # D's gap is filled
    assert resolver(directory, keyring, s3).local(WORLD[3]).verified is not None

    # the per-plan fallback fills gaps too, and does not even read what a rank holds valid
    s3.httpd.state = FaultState()
    serve(s3, signed_world(signer, WORLD, NOW - timedelta(hours=2)), signer, with_set=False)
    second = node(tmp_path, "second")
    second.path.mkdir(parents=True)
    second.write(WORLD[1], plan_b, sig_b)
    assert boot(second, keyring, s3, WORLD[2], WORLD).verified is not None
    assert second.read(WORLD[1]) == (plan_b, sig_b) and second.fingerprints() == sorted(WORLD)
    assert plan_name(WORLD[1]) not in dict(gets(s3))


# -- 4. the outcome file is a hint, never a hazard -------------------------------------------------


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


OUTCOMES = {
    "nan": lambda doc: json.dumps({**doc, "at": float("nan")}),
    "1e999": lambda doc: json.dumps(doc).replace('"at": 0', '"at": 1e999'),
    "huge-int": lambda doc: json.dumps(doc).replace('"at": 0', '"at": 1' + "0" * 400),
    "future": lambda doc: json.dumps({**doc, "at": time.time() + 10**6}),
    "nesting": lambda doc: (
        json.dumps({**doc, "at": time.time()})[:-1] + ', "deep": ' + _nested(1500) + "}"
    ),
    "duplicate-key": lambda doc: '{"set": "another", ' + json.dumps({**doc, "at": time.time()})[1:],
    "wrong-types": lambda doc: json.dumps(
        {**doc, "at": time.time(), "members": {doc["_fp"]: ["timeout"]}}
    ),
}


@pytest.mark.parametrize("content", ["valid", *OUTCOMES])
def test_a_malformed_outcome_file_is_no_record(
    content: str, s3: LoopbackServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank that waited on its set's lock reads the fetching rank's outcome: a well-formed fresh
    one it takes (no request of its own); anything malformed it ignores and reads the store."""
    signer = make_signer()
    name = serve(s3, signed_world(signer, WORLD, NOW - timedelta(hours=1)), signer)
    directory = node(tmp_path)
    directory.path.mkdir(parents=True)
    fp = WORLD[2]
    waiting = threading.Event()
    real = node_plans.locked

    def watched(base: Path, key: Path, *, wait: float | None = None, **kw: Any) -> Any:
        if wait:
            waiting.set()
        return real(base, key, wait=wait, **kw)

    monkeypatch.setattr(node_plans, "locked", watched)
    got: dict[str, Any] = {}

    def rank() -> None:
        try:
            got["result"] = boot(directory, keyring_of(signer), s3, fp, WORLD)
        except BaseException as exc:
            got["raised"] = exc

    # the "fetching rank": this set's lock (and the single node lock before it)
    with ExitStack() as held:
        for key in (set_key(directory.path, name), directory.path):
            held.enter_context(locked(key.parent, key, wait=5))
        thread = threading.Thread(target=rank)
        thread.start()
        assert waiting.wait(30), "the rank never waited on the lock"
        doc = {
            "set": name,
            "at": 0,
            "applied": False,
            "reason": "timeout",
            "detail": "held",
            "members": {fp: {"applied": False, "reason": "timeout", "detail": "held"}},
            "_fp": fp,
        }
        text = (
            json.dumps({**doc, "at": time.time()}) if content == "valid" else OUTCOMES[content](doc)
        )
        for path in (
            outcome_path(directory.path, name),
            directory.path.with_name("startup_plan.plancache-fetch.json"),
        ):
            path.write_text(text)
    thread.join(BUDGET + 10)
    assert "raised" not in got, got.get("raised")
    result = got["result"]
    if content == "valid":
        assert (
            result.error is not None and result.error.reason.value == "timeout" and gets(s3) == []
        )
    else:
        assert result.verified is not None and result.error is None, result
        assert dict(gets(s3)) == {name: 1}
