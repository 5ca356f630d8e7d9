"""PoC 2: `prune --storage-option mirror_reads=true` deletes the registry's plan set because the
mirror's tag list leaves out one of its plans.

Tried: a registry (tests/registry_stub.py on 127.0.0.1) holding plans A and B, signed, and the
plan set S of both; a mirror (a second stub, 127.0.0.2) serving the same objects except that its
tags/list leaves out A's tag (a stale pull-through cache, or a hostile mirror). The operator
audits through the mirror as documented (`mirror_reads=true`) with a prune that should delete
nothing: `prune URL --older-than 3650d --unconditional`.
Happened: prune_sets judges S "holds a plan the store no longer lists" from the *mirror's*
listing and deletes S on the registry (deletes go to the origin, with no re-read there), exit 0.
A good plan set is lost on the registry on the word of a mirror.

Run: PYTHONPATH=src:tests python redteam/poc_prune_sets_via_mirror.py
(OLD=1 for 6a1747b, which has no mirror_reads: every read went through the mirror.)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

from registry_stub import RegistryStub

from plancache.cli.main import main
from plancache.keys.keyfile import generate_keypair
from plancache.keys.schemes import load_signer
from plancache.pipeline.resolver import utcnow
from plancache.storage.oci.artifacts import slot_of
from plancache.storage.store import open_store
from plancache.trust.plans.plan import Plan, plan_name, render_plan, sig_name
from plancache.trust.plans.plan_set import build_set
from plancache.trust.signing import sign_plan

GIB = 1 << 30
WORLD = [f"{0xA0D17_0000 + r:016x}" for r in range(2)]


def run() -> dict[str, object]:
    home = Path(tempfile.mkdtemp())
    generate_keypair(home / "ci", force=False, comment="ci")
    signer = load_signer(str(home / "ci"))
    when = utcnow() - timedelta(hours=1)
    members, objects = [], {}
    for rank, fp in enumerate(WORLD):
        data = render_plan(Plan(fp, 4 * GIB, 70 * GIB))
        sig = sign_plan(plan_name(fp), data, signer, when, provenance={"rank": rank, "world_size": 2})
        members.append((fp, data, sig))
        objects[plan_name(fp)] = data
        objects[sig_name(fp)] = sig
    set_name, set_data = build_set(members, signer, when)
    objects[set_name] = set_data
    origin, mirror = RegistryStub(), RegistryStub(address="127.0.0.2")
    for server in (origin, mirror):
        open_store(server.url("team/plans"), {"mirror_config": "none"}, timeout=30).put_many(objects)
    stale = slot_of(plan_name(WORLD[0])).tag
    mirror.state.tags.pop(stale)  # the mirror's listing leaves out plan A
    before = sorted(origin.state.tags)
    code = main([
        "prune", origin.url("team/plans"), "--older-than", "3650d", "--unconditional",
        "--storage-option", f"mirror=http://{mirror.host}",
        *([] if os.environ.get("OLD") else ["--storage-option", "mirror_reads=true"]), "--json",
    ])
    after = sorted(origin.state.tags)
    return {
        "exit": code,
        "registry tags lost": sorted(set(before) - set(after)),
        "set tag": slot_of(set_name).tag,
    }


if __name__ == "__main__":
    print(json.dumps(run()), file=sys.stderr)
