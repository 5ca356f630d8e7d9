"""Plan sets (docs/boot-storm.md): one signed object per world, verified before it is parsed.

The trust core's refusals (tampered, two bakes mixed, a member that is not its fingerprint, a
set for another world, a replica that differs, a key not trusted), each with an existing
reason string; then the round trip on S3 (moto), Azure (Azurite) and GCS (emulator): ``push
--key`` writes the per-plan objects and the set, ``ls`` and ``verify`` report it, a node reads
it once for all its ranks, a tampered set falls back to the per-plan objects, ``prune`` takes
the set with its plans.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from conftest import NOW, keyring_of, make_signer
from plancache.cli.main import main
from plancache.clock import Deadline
from plancache.keys.keyfile import generate_keypair
from plancache.pipeline.plan_sets.node_plans import outcome_path, resolve_node
from plancache.pipeline.resolver import Resolver, utcnow
from plancache.pipeline.trust_config import worker_policy
from plancache.storage.local.localdir import LocalPlanDir
from plancache.storage.store import Store, open_store
from plancache.trust import envelope as dsse
from plancache.trust.errors import PlanCacheError, Rejected
from plancache.trust.plans.plan import Plan, plan_name, render_plan
from plancache.trust.plans.plan_set import build_set, split_set, verify_set
from plancache.trust.plans.plan_set_names import replica_name, set_name
from plancache.trust.signing import sign_plan
from plancache.trust.verify import verify_plan
from store_servers import (
    azurite,  # noqa: F401 - a fixture, named as a parameter
    gcs_emulator,  # noqa: F401 - a fixture, named as a parameter
    moto_server,  # noqa: F401 - a fixture, named as a parameter
)

WORLD = [f"{0x5E7_0000 + r:016x}" for r in range(4)]


def members(
    signer: Any, world: list[str] = WORLD, kv: int = 20 << 30, when: Any = NOW
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


def refused(name: str, data: bytes, keyring: Any) -> str:
    with pytest.raises(Rejected) as info:
        verify_set(name, data, keyring, NOW)
    return info.value.reason.value


# -- the trust core -------------------------------------------------------------------------------


def test_a_set_verifies_every_member_against_its_own_fingerprint() -> None:
    signer = make_signer()
    name, data = build_set(members(signer), signer, NOW)
    verified = verify_set(name, data, keyring_of(signer), NOW)
    assert name == set_name(WORLD) and [p.fingerprint for p in verified.plans] == WORLD
    assert all(
        p.statement is not None and p.statement.provenance["rank"] == r
        for r, p in enumerate(verified.plans)
    )
    # each member's own sidecar verifies alone: what a node writes locally is today's layout
    for fp, plan, sig in members(signer):
        assert verify_plan(plan_name(fp), plan, sig, keyring_of(signer), NOW).fingerprint == fp


def test_tampered_mixed_and_foreign_sets_are_refused() -> None:
    signer = make_signer()
    keyring = keyring_of(signer)
    name, data = build_set(members(signer), signer, NOW)
    assert (
        refused(name, data[:-2] + bytes([data[-2] ^ 1]) + data[-1:], keyring) == "digest-mismatch"
    )
    # two bakes of one world: bake B's envelope over bake A's body, and A's rank 2 put into B's set
    _, other = build_set(
        members(signer, kv=10 << 30, when=NOW - timedelta(days=1)), signer, NOW - timedelta(days=1)
    )
    head_a, body_a = split_set(data)
    head_b, _body_b = split_set(other)
    assert refused(name, head_b + body_a, keyring) == "digest-mismatch"
    a, b = members(signer), members(signer, kv=10 << 30)
    mixed = [b[0], b[1], a[2], b[3]]  # one rank rolled back to the other bake
    spliced = b"".join(plan + sig for _, plan, sig in mixed)
    assert refused(name, head_b + spliced, keyring) == "digest-mismatch"
    # the set of another world (a rank's name is computed from its own world)
    assert refused(set_name(WORLD[:3]), data, keyring) == "name-mismatch"
    assert refused(name, data, keyring_of(make_signer())) == "untrusted-key"
    # a set envelope is no plan sidecar, and a sidecar no set
    with pytest.raises(Rejected) as info:
        verify_plan(plan_name(WORLD[0]), members(signer)[0][1], head_a, keyring, NOW)
    assert info.value.reason.value == "malformed"


def test_a_member_that_is_not_its_fingerprint_is_refused() -> None:
    signer = make_signer()
    good = members(signer)
    # rank 1's slot holds rank 0's plan bytes, with a sidecar signed for rank 1's name: the set's
    # signature is fine (the signer made it), the member's fingerprint check refuses it
    wrong = good[0][1]
    sig = sign_plan(plan_name(WORLD[0]), wrong, signer, NOW)
    env = dsse.decode(sig)
    forged = list(good)
    forged[1] = (WORLD[1], wrong, dsse.encode(env))
    name, data = build_set(forged, signer, NOW)
    assert refused(name, data, keyring_of(signer)) in ("fingerprint-mismatch", "name-mismatch")
    # a member signed by another key (threshold per plan still holds inside a set)
    stranger = make_signer()
    forged = list(good)
    forged[3] = members(stranger)[3]
    name, data = build_set(forged, signer, NOW)
    assert refused(name, data, keyring_of(signer)) == "untrusted-key"


def test_a_replica_is_verified_under_its_sets_name() -> None:
    signer = make_signer()
    name, data = build_set(members(signer), signer, NOW)
    assert replica_name(name, 2).endswith(".r2.set") and replica_name(name, 0) == name
    # never under its own name
    assert refused(replica_name(name, 2), data, keyring_of(signer)) == "malformed"
    assert verify_set(name, data, keyring_of(signer), NOW).name == name


# -- stores ---------------------------------------------------------------------------------------


@pytest.fixture(params=["s3", "azure", "gcs"])
def remote(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, dict[str, Any]]]:
    if request.param == "s3":
        moto = request.getfixturevalue("moto_server")
        yield f"s3://{moto.new_bucket()}/fleet", moto.options
    elif request.param == "azure":
        server = request.getfixturevalue("azurite")
        yield f"az://{server.new_container()}/fleet", server.options
    else:
        gcs = request.getfixturevalue("gcs_emulator")
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
        yield f"gs://{gcs.new_bucket()}/fleet", {"token": "anon"}


def cli(
    capsys: pytest.CaptureFixture[str], options: dict[str, Any], *argv: str
) -> tuple[int, dict[str, Any]]:
    opts = [x for k, v in options.items() for x in ("--storage-option", f"{k}={json.dumps(v)}")]
    code = main([*argv, *opts, "--json"])
    out, _ = capsys.readouterr()
    return code, json.loads(out)


def baked(tmp_path: Path, ranks: int = 4) -> tuple[Path, Path, list[str]]:
    generate_keypair(tmp_path / "ci", force=False, comment="ci")
    from plancache.keys.schemes import load_signer

    signer = load_signer(str(tmp_path / "ci"))
    directory = tmp_path / "bake"
    directory.mkdir()
    for fp, plan, sig in members(signer, WORLD[:ranks], when=utcnow() - timedelta(hours=2)):
        (directory / plan_name(fp)).write_bytes(plan)
        (directory / (plan_name(fp) + ".sig")).write_bytes(sig)
    return directory, tmp_path / "ci", WORLD[:ranks]


def test_round_trip_push_ls_verify_resolve_prune(
    remote: tuple[str, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, options = remote
    directory, key, world = baked(tmp_path)
    code, doc = cli(
        capsys, options, "push", str(directory), url, "--key", str(key), "--set-replicas", "2"
    )
    assert (
        code == 0
        and doc["uploaded"] == 4
        and [s["name"] for s in doc["plan_sets"]] == [set_name(world)]
    )
    code, doc = cli(capsys, options, "verify", url, "--trusted-keys", f"{key}.pub")
    assert code == 0 and len(doc["plans"]) == 4
    assert sorted((s["name"], s["status"]) for s in doc["plan_sets"]) == [
        (replica_name(set_name(world), 1), "valid"),
        (set_name(world), "valid"),
    ]
    code, doc = cli(capsys, options, "ls", url)
    assert code == 0 and {s["status"] for s in doc["plan_sets"]} == {"unverified"}
    assert all(s["fingerprints"] == world for s in doc["plan_sets"])

    # a node: rank 2 reads the set (replica 1) once; every rank's plan is then local
    store = open_store(url, options, 30)
    policy = worker_policy(f"{key}.pub", 1)
    node = LocalPlanDir(tmp_path / "node" / "vllm" / "startup_plan")
    result = resolve_node(
        Resolver(node, policy, store), world[2], world, Deadline.after(store.timeout), replica=1
    )
    assert result.verified is not None and "plan set" in result.note
    assert node.fingerprints() == sorted(world) and outcome_path(node.path).exists()
    for fp in world:  # the other ranks: local hits, verified as today
        assert Resolver(node, policy, store).local(fp).verified is not None

    # a tampered set: refused, and the node falls back to the per-plan objects
    name = set_name(world)
    head, body = split_set(store.open_backend().fs.cat_file(store.path(name)))
    store.open_backend().fs.pipe_file(store.path(name), head + body[:-1] + b" ")
    code, doc = cli(capsys, options, "verify", url, "--trusted-keys", f"{key}.pub")
    assert (
        code == 1 and {s["name"]: s["reason"] for s in doc["plan_sets"]}[name] == "digest-mismatch"
    )
    refused = next(s for s in doc["plan_sets"] if s["name"] == name)
    # with keys, a claim is not shown
    assert refused["fingerprints"] == [] and refused["status"] != "valid"
    # the verified replica's
    assert next(s for s in doc["plan_sets"] if s["name"] != name)["fingerprints"] == world
    fresh = LocalPlanDir(tmp_path / "node2" / "vllm" / "startup_plan")
    result = resolve_node(
        Resolver(fresh, policy, open_store(url, options, 30)), world[0], world, Deadline.after(30)
    )
    assert result.verified is not None and "plan set rejected (digest-mismatch" in result.note
    assert fresh.fingerprints() == sorted(world)

    # prune takes the sets with their plans
    # the emulator has no preconditions
    emulated = ["--unconditional"] if url.startswith("gs://") else []
    code, doc = cli(capsys, options, "prune", url, "--older-than", "1h", *emulated)
    assert code == 0 and len(doc["deleted"]) == 4, doc
    assert sorted(doc["plan_sets_deleted"]) == sorted([name, replica_name(name, 1)])
    assert list(open_store(url, options, 30).iter_objects()) == []


def test_a_store_without_sets_still_serves_a_node(
    remote: tuple[str, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What an older plancache pushed (per-plan objects only): one rank reads every rank's plan."""
    url, options = remote
    directory, key, world = baked(tmp_path)
    code, doc = cli(capsys, options, "push", str(directory), url)  # no --key: no set
    assert code == 0 and doc["plan_sets"] == []
    node = LocalPlanDir(tmp_path / "node" / "vllm" / "startup_plan")
    store = open_store(url, options, 30)
    result = resolve_node(
        Resolver(node, worker_policy(f"{key}.pub", 1), store), world[1], world, Deadline.after(30)
    )
    assert result.verified is not None and node.fingerprints() == sorted(world)


def test_the_set_store_helpers_refuse_other_names(tmp_path: Path) -> None:
    from plancache.storage.plan_set_objects import read_set

    (tmp_path / "s").mkdir()
    store: Store = open_store((tmp_path / "s").as_uri(), None, 5)
    with pytest.raises(PlanCacheError):
        read_set(store, "startup_plan_0123456789abcdef.json")
    assert read_set(store, set_name(WORLD)) is None
