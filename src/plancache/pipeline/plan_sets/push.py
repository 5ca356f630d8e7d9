"""Plan sets at push time: group a directory's signed plans into worlds, sign each world as one.

A world is the plans of one bake: every rank ``0 .. world_size-1`` once, with the same signed
provenance apart from ``rank`` (model, vLLM and torch versions, device, utilization,
``world_size``). Only plans whose sidecar verifies under the signer's own key are grouped, so a
set never carries a plan the signer did not vouch for. A world with a rank missing or twice
(two bakes of one configuration in one directory) gets no set: its ranks still boot from
the per-plan objects, which push uploads as always. A wrong grouping could only produce a set
whose name no world computes (the name is the hash of the ordered fingerprints): never a wrong
plan, since a rank reads the set named by its own world and every member is verified against
its own fingerprint.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from ...clock import Deadline
from ...storage.local.localdir import LocalPlanDir
from ...storage.store import Store
from ...trust.errors import PlanCacheError
from ...trust.keyring.keys import Signer, signer_keyring
from ...trust.plans.plan import plan_name
from ...trust.plans.plan_set import build_set
from ...trust.plans.plan_set_names import MAX_MEMBERS, replica_name
from ...trust.verify import verify_plan
from ..directory_signing import signing_moment


@dataclass
class SetEntry:
    name: str
    fingerprints: list[str]
    action: str = ""
    """``uploaded`` or ``skipped`` (in a dry run: what would happen)."""
    detail: str = ""


def worlds(
    directory: LocalPlanDir, fingerprints: Sequence[str], signer: Signer, now: datetime
) -> tuple[list[list[tuple[str, bytes, bytes]]], list[str]]:
    """Complete worlds (members in rank order) among ``fingerprints``, and why others are not."""
    keyring = signer_keyring(signer)
    groups: dict[str, dict[int, list[tuple[str, bytes, bytes]]]] = {}
    sizes: dict[str, int] = {}
    for fp in fingerprints:
        try:
            plan, sig = directory.read(fp)
            if plan is None or sig is None:
                continue
            statement = verify_plan(plan_name(fp), plan, sig, keyring, now).statement
        except PlanCacheError:
            continue  # not the signer's own: never put into a set
        facts = dict(statement.provenance) if statement is not None else {}
        rank, size = facts.pop("rank", None), facts.get("world_size")
        if (
            not isinstance(rank, int)
            or not isinstance(size, int)
            or not 0 <= rank < size <= MAX_MEMBERS
        ):
            continue
        key = json.dumps(facts, sort_keys=True)
        sizes[key] = size
        groups.setdefault(key, {}).setdefault(rank, []).append((fp, plan, sig))
    complete, problems = [], []
    for key, ranks in groups.items():
        if sorted(ranks) != list(range(sizes[key])) or any(len(v) != 1 for v in ranks.values()):
            held = ", ".join(f"{r}x{len(v)}" for r, v in sorted(ranks.items()))
            problems.append(
                f"world of {sizes[key]} rank(s) with ranks {held}: "
                "no plan set (each rank once needed)"
            )
            continue
        complete.append([ranks[r][0] for r in range(sizes[key])])
    return complete, problems


def push_sets(
    directory: LocalPlanDir,
    store: Store,
    deadline: Deadline,
    now: datetime,
    signer: Signer,
    *,
    fingerprints: Sequence[str] | None = None,
    replicas: int = 1,
    expires_in: timedelta | None = None,
    dry_run: bool = False,
) -> tuple[list[SetEntry], list[str]]:
    """Sign and upload one set (and ``replicas - 1`` copies) per complete world in ``directory``.

    Called after the per-plan objects are uploaded, so a reader that finds a set finds its
    plans too; a set changes nothing for older plancache versions, which read per-plan objects."""
    fps = directory.fingerprints() if fingerprints is None else list(dict.fromkeys(fingerprints))
    complete, problems = worlds(directory, fps, signer, now)
    entries: list[SetEntry] = []
    objects: dict[str, bytes] = {}
    expires_at = now + expires_in if expires_in is not None else None
    for members in complete:
        # keyless: dated when it signs (after the plans' upload), as its log will record
        name, data = build_set(members, signer, signing_moment(signer, now), expires_at=expires_at)
        entries.append(
            SetEntry(
                name,
                [fp for fp, _, _ in members],
                "uploaded",
                f"{len(members)} rank(s), {replicas} cop(ies)",
            )
        )
        for index in range(replicas):
            objects[replica_name(name, index)] = data
    if objects and not dry_run:
        store.put_many(objects, deadline)
    return entries, problems
