"""Plan sets in ``verify``, ``ls`` and ``prune`` of a store: bounded, all or nothing, rollbacks
seen.

Against real parts: the loopback S3-wire :class:`FaultServer` (objects that trickle, or a
handler here that answers 403 to chosen objects) and a ``file://`` store, through the CLI.

* one ``--timeout`` for the whole audit: six slow sets end within it, each ``timeout``;
* 300 junk sets of 1 MiB audited one at a time (tracemalloc's peak, in this process);
* prune with a set it cannot read, or cannot delete: exit 2 naming it, and no plan deleted,
  so no set serves a pruned plan;
* rollbacks: a replica (the set gone) or a set and its replica older than the per-plan
  objects is ``digest-mismatch``, exit 1.
"""

from __future__ import annotations

import json
import os
import time
import tracemalloc
from collections.abc import Iterator
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import jsonschema
import pytest

from plancache.cli.main import main
from plancache.keys.keyfile import generate_keypair
from plancache.keys.schemes import load_signer
from plancache.pipeline.resolver import utcnow
from plancache.trust.plans.plan import Plan, plan_name, render_plan, sig_name
from plancache.trust.plans.plan_set import build_set
from plancache.trust.plans.plan_set_names import replica_name
from plancache.trust.signing import sign_plan
from store_servers import (
    AWS_ENV,
    FaultObject,
    FaultServer,
    FaultState,
    LoopbackServer,
    _FaultHandler,
    fault_server,  # noqa: F401 - a fixture, named as a parameter
    fault_server_session,  # noqa: F401 - a fixture, named as a parameter
)

WORLD = [f"{0xA0D17_0000 + r:016x}" for r in range(2)]
PREFIX = "fleet"
URL = f"s3://bucket/{PREFIX}"
GIB = 1 << 30
SCHEMA = json.loads(resources.files("plancache.cli").joinpath("report.schema.json").read_text())


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in AWS_ENV.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def key(tmp_path: Path) -> Path:
    generate_keypair(tmp_path / "ci", force=False, comment="ci")
    return tmp_path / "ci"


def bake(key: Path, kv: int, when: datetime) -> list[tuple[str, bytes, bytes]]:
    """Every rank's plan and sidecar of one bake, signed at ``when``."""
    signer = load_signer(str(key))
    out = []
    for rank, fp in enumerate(WORLD):
        data = render_plan(Plan(fp, kv, 70 * GIB))
        out.append(
            (
                fp,
                data,
                sign_plan(
                    plan_name(fp),
                    data,
                    signer,
                    when,
                    provenance={"rank": rank, "world_size": len(WORLD)},
                ),
            )
        )
    return out


def put_plans(state: FaultState, members: list[tuple[str, bytes, bytes]]) -> None:
    for fp, data, sig in members:
        state.objects[f"{PREFIX}/{plan_name(fp)}"] = FaultObject(data)
        state.objects[f"{PREFIX}/{sig_name(fp)}"] = FaultObject(sig)


def put_set(
    state: FaultState,
    key: Path,
    members: list[tuple[str, bytes, bytes]],
    when: datetime,
    *replicas: int,
) -> str:
    """The set of ``members`` signed at ``when`` as the given copies (0: the set itself)."""
    name, data = build_set(members, load_signer(str(key)), when)
    for index in replicas:
        state.objects[f"{PREFIX}/{replica_name(name, index)}"] = FaultObject(data)
    return name


def cli(
    capsys: pytest.CaptureFixture[str], endpoint: str, *argv: str
) -> tuple[int, dict[str, Any], str]:
    code = main([*argv, "--storage-option", f"endpoint_url={endpoint}", "--json"])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    # the new keys (plan_set_errors, each set's fields) are in the schema
    jsonschema.validate(doc, SCHEMA)
    return code, doc, err


# -- one deadline, bounded memory -------------------------------------------------------------


def test_verify_keeps_one_deadline_across_plans_and_sets(
    fault_server: FaultServer, key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Six set objects that trickle a byte every 0.2 s: each read used to get a fresh 5 s
    budget (30 s in all); one deadline ends the whole audit at 5 s, the rest unread."""
    put_plans(fault_server.state, bake(key, 20 * GIB, utcnow() - timedelta(hours=1)))
    names = [f"startup_planset_{i:016x}.set" for i in range(6)]
    for name in names:
        fault_server.state.objects[f"{PREFIX}/{name}"] = FaultObject(b"x" * 100, "trickle")
    started = time.monotonic()
    code, doc, _ = cli(
        capsys,
        fault_server.endpoint,
        "verify",
        URL,
        "--trusted-keys",
        f"{key}.pub",
        "--timeout",
        "5",
    )
    elapsed = time.monotonic() - started
    assert elapsed < 12, f"verify --timeout 5 took {elapsed:.1f} s"
    assert code == 1 and doc["ok"] is False
    assert sorted(s["name"] for s in doc["plan_sets"]) == names
    assert all(
        (s["status"], s["reason"]) == ("store-error", "timeout") for s in doc["plan_sets"]
    ), doc["plan_sets"]
    assert all(p["status"] == "valid" for p in doc["plans"])  # the plans were read in time


def test_300_junk_sets_are_audited_one_at_a_time(
    tmp_path: Path, key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """300 sets of 1 MiB of junk (hard links of one file: 1 MiB on disk): the audit's peak
    memory stays far below what holding them all would take (it held 340 MiB)."""
    junk = tmp_path / "junk"
    junk.write_bytes(b"j" * (1 << 20))
    warm, store = tmp_path / "warm", tmp_path / "store"
    for directory, count in ((warm, 1), (store, 300)):
        directory.mkdir()
        for i in range(count):
            os.link(junk, directory / f"startup_planset_{i:016x}.set")
    argv = ["verify", "--trusted-keys", f"{key}.pub", "--allow-empty", "--json"]
    main([*argv, warm.as_uri()])  # imports and caches made outside the measurement
    capsys.readouterr()
    tracemalloc.start()
    try:
        code = main([*argv, store.as_uri()])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    doc = json.loads(capsys.readouterr()[0])
    assert peak < 64 << 20, f"peak {peak >> 20} MiB"
    assert len(doc["plan_sets"]) == 300 and {s["reason"] for s in doc["plan_sets"]} == {"malformed"}
    assert code == 1 and doc["ok"] is False  # --allow-empty forgives no plans, not 300 bad sets


# -- prune: all or nothing ------------------------------------------------------------------------


class _Guarded(_FaultHandler):
    """The fault server's objects, except that those named in ``server.denied`` answer 403 to
    a GET and those in ``server.undeletable`` 403 to a DELETE (as a bucket policy would)."""

    def _key(self) -> str:
        return unquote(urlparse(self.path).path).lstrip("/").split("/", 1)[-1]

    def _deny(self) -> None:
        body = (
            b"<?xml version='1.0'?><Error><Code>AccessDenied</Code>"
            b"<Message>Access Denied</Message></Error>"
        )
        self._send(403, body, {"Content-Type": "application/xml"})

    def do_GET(self) -> None:
        if self._key() in self.server.denied:
            return self._deny()
        return super().do_GET()

    def do_DELETE(self) -> None:
        if self._key() in self.server.undeletable:
            return self._deny()
        return super().do_DELETE()


@pytest.fixture
def guarded() -> Iterator[LoopbackServer]:
    server = LoopbackServer(_Guarded, state=FaultState(), denied=set(), undeletable=set())
    yield server
    server.stop()


@pytest.mark.parametrize("fault", ["error500", "read403", "delete403"])
def test_prune_keeps_every_plan_when_a_set_cannot_be_read_or_deleted(
    fault: str, guarded: LoopbackServer, key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state: FaultState = guarded.httpd.state
    members = bake(key, 20 * GIB, utcnow() - timedelta(hours=2))
    put_plans(state, members)
    name = put_set(state, key, members, utcnow() - timedelta(hours=2), 0)
    where = f"{PREFIX}/{name}"
    if fault == "error500":
        state.objects[where].mode = "error500"
    else:
        chosen = guarded.httpd.denied if fault == "read403" else guarded.httpd.undeletable
        chosen.add(where)
    before = sorted(state.objects)
    code, doc, err = cli(
        capsys, guarded.endpoint, "prune", URL, "--older-than", "1h", "--unconditional"
    )
    assert code == 2 and doc["ok"] is False and doc["deleted"] == [], doc
    assert [s["name"] for s in doc["plan_set_errors"]] == [name]
    line = [e for e in err.splitlines() if "prune refused" in e]
    assert len(line) == 1 and name in line[0], err
    assert ("could not be deleted" if fault == "delete403" else "could not be read") in line[0]
    assert sorted(state.objects) == before  # the set and every plan it serves are still there

    # the set readable and deletable again: it goes first, then the plans
    state.objects[where].mode = "ok"
    guarded.httpd.denied.clear(), guarded.httpd.undeletable.clear()
    code, doc, _ = cli(
        capsys, guarded.endpoint, "prune", URL, "--older-than", "1h", "--unconditional"
    )
    assert code == 0 and doc["plan_sets_deleted"] == [name] and doc["plan_set_errors"] == []
    assert sorted(d["fingerprint"] for d in doc["deleted"]) == WORLD and state.objects == {}
    deletes = [path for method, path, _ in state.requests if method == "DELETE"]
    assert deletes[0].endswith(name)  # the set before any plan


# -- rollbacks --------------------------------------------------------------------------------


def test_verify_fails_a_replica_older_than_the_plans_when_the_set_is_gone(
    fault_server: FaultServer, key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    today, yesterday = utcnow() - timedelta(hours=1), utcnow() - timedelta(days=1)
    state = fault_server.state
    put_plans(state, bake(key, 20 * GIB, today))
    # no r0: the set is gone
    name = put_set(state, key, bake(key, 10 * GIB, yesterday), yesterday, 1)
    code, doc, _ = cli(capsys, fault_server.endpoint, "verify", URL, "--trusted-keys", f"{key}.pub")
    assert code == 1 and all(p["status"] == "valid" for p in doc["plans"])
    (replica,) = doc["plan_sets"]
    assert replica["name"] == replica_name(name, 1) and replica["reason"] == "digest-mismatch", (
        replica
    )
    assert "older" in replica["detail"] and replica["status"] == "invalid"

    # beside it, a newer replica: that one is fine, the old one is older than it too
    put_set(state, key, bake(key, 20 * GIB, today), today, 2)
    code, doc, _ = cli(capsys, fault_server.endpoint, "verify", URL, "--trusted-keys", f"{key}.pub")
    reports = {s["name"]: s for s in doc["plan_sets"]}
    assert code == 1 and reports[replica_name(name, 2)]["status"] == "valid"
    assert reports[replica_name(name, 1)]["reason"] == "digest-mismatch"


def test_verify_fails_a_set_and_replica_both_older_than_the_plans(
    fault_server: FaultServer, key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    today, yesterday = utcnow() - timedelta(hours=1), utcnow() - timedelta(days=1)
    state = fault_server.state
    current = bake(key, 20 * GIB, today)
    put_plans(state, current)
    name = put_set(state, key, current, today, 0, 1)
    code, doc, _ = cli(capsys, fault_server.endpoint, "verify", URL, "--trusted-keys", f"{key}.pub")
    assert code == 0 and [s["status"] for s in doc["plan_sets"]] == ["valid", "valid"], doc[
        "plan_sets"
    ]

    # yesterday's bake, both copies
    put_set(state, key, bake(key, 10 * GIB, yesterday), yesterday, 0, 1)
    code, doc, _err = cli(
        capsys, fault_server.endpoint, "verify", URL, "--trusted-keys", f"{key}.pub"
    )
    assert code == 1 and all(p["status"] == "valid" for p in doc["plans"])
    assert sorted(s["name"] for s in doc["plan_sets"]) == sorted([name, replica_name(name, 1)])
    assert all(
        s["reason"] == "digest-mismatch" and plan_name(WORLD[0]) in s["detail"]
        for s in doc["plan_sets"]
    )
