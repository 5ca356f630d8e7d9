"""One store read per node for all its ranks: the boot-storm path beside :class:`Resolver.resolve`.

Every rank of a world computes every rank's fingerprint, hence the name of their plan set
(:mod:`plancache.trust.plans.planset`). So on a local miss, a rank takes the node lock (the compile
cache's: :func:`plancache.storage.compile_cache.cachedir.locked`, on vLLM's plan directory),
looks locally again, and only then reads the store once for the whole node:

* the set object: verified in the trust core, then every member written into vLLM's plan
  directory (plan, then sidecar, each atomically: the layout vLLM and today's plancache read);
* no set in the store (one written by an older plancache): the per-plan objects of every
  rank, fetched together as today, verified and written;
* a set that is refused: noted, then the per-plan objects, so a set never makes things worse
  than a store without one.

The other ranks wait on the lock within their deadline and find a local hit. A rank that had
to wait never reads the store itself: it takes the fetching rank's outcome, recorded beside
the lock (:data:`OUTCOME_SUFFIX`), so all the ranks of a node decide alike and a refusing store
gets one request per node, not one per rank. Only when no rank of this boot recorded an
outcome (the fetching rank died) does a waiting rank read the store itself.
"""

from __future__ import annotations

import hashlib
import json
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ...storage.compile_cache.cachedir import locked
from ...storage.deadline import JOIN_GRACE, store_error
from ...storage.local.files import read_capped, write_atomic
from ...storage.plansets import read_set
from ...trust.display import safe_text
from ...trust.errors import PlanCacheError, Reason, StoreError, StoreTimeout
from ...trust.plans.planset import replica_name, set_name
from ...trust.result import PlanResult

if TYPE_CHECKING:
    from ..resolver import Resolver

OUTCOME_SUFFIX = ".plancache-fetch.json"
"""Beside vLLM's plan directory and its lock (``startup_plan.plancache-fetch.json``), never in it
(the directory keeps vLLM's layout): the last node fetch's set name, wall-clock time, outcome."""

MAX_OUTCOME_BYTES = 4096

LOCK_MARGIN = 0.25
"""Seconds a waiting rank waits beyond the fetching rank's latest end, for its verify and writes."""


def replica_of(node: str, replicas: int) -> int:
    """Which copy of a set this node reads: a stable hash of its identity (its host name), so
    a fleet spreads evenly over the copies and a node reads the same copy every boot."""
    if replicas <= 1:
        return 0
    return int.from_bytes(hashlib.sha256(node.encode("utf-8", "replace")).digest()[:8], "big") % replicas


def resolve_node(resolver: "Resolver", fp: str, world: Sequence[str], deadline: float, replica: int = 0) -> PlanResult:
    """This rank's verified plan, the store read at most once per node for ``world``'s plans.

    ``world`` is every rank's fingerprint in rank order (``fp`` among them); ``replica`` the copy
    of the set to read (:func:`replica_of`; a missing copy falls back to the set itself). Local
    first, as :meth:`Resolver.resolve`; a policy that reads no store never gets here."""
    local = resolver.local(fp)
    if local.verified is not None or not resolver.reads_store:
        return local
    directory = resolver.directory.path
    name = set_name(world)
    asked = time.time()
    with ExitStack() as stack:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            waited = _lock(stack, directory, deadline)
        except StoreTimeout as exc:
            return PlanResult(fp, "store", error=exc, note="waited for the node's fetching rank")
        except (OSError, StoreError):  # no lock to be had (an odd mount): this rank reads for itself
            waited = False
        again = resolver.local(fp)
        if again.verified is not None:
            return again.with_note("fetched by another rank of this node") if waited else again
        if waited:
            recorded = _recorded(directory, name, asked, fp)
            if recorded is not None:
                return recorded
        try:
            result = _fetch(resolver, fp, world, name, deadline, replica)
        except Exception as exc:  # noqa: BLE001 - whatever it was, the waiting ranks hear of it
            result = PlanResult(fp, "store", error=store_error("cannot fetch the plan set", exc))
        _record(directory, name, result)
    if local.error is not None:
        return result.with_note(f"local plan rejected ({local.error.reason}: {local.error.detail})")
    return result


def _lock(stack: ExitStack, directory: Path, deadline: float) -> bool:
    """Take the node lock; True if another rank held it (this rank waited)."""
    try:
        stack.enter_context(locked(directory.parent, directory, wait=0))
        return False
    except StoreTimeout:
        pass
    # the fetching rank may end up to a deadline's join grace after its deadline (an answer
    # that arrived in time, verified and written): waiting as long keeps the node's ranks alike
    remaining = deadline + JOIN_GRACE + LOCK_MARGIN - time.monotonic()
    if remaining <= 0:
        raise StoreTimeout("no time left in the budget to wait for the node's fetching rank")
    stack.enter_context(locked(directory.parent, directory, wait=remaining))
    return True


def _fetch(resolver: "Resolver", fp: str, world: Sequence[str], name: str, deadline: float, replica: int) -> PlanResult:
    """The set (verified, every member persisted), else every rank's per-plan objects."""
    note = ""
    try:
        store = resolver.store
        data = read_set(store, replica_name(name, replica), deadline)
        if data is None and replica:
            data = read_set(store, name, deadline)
    except PlanCacheError as exc:
        return PlanResult(fp, "store", error=exc)
    if data is not None:
        try:
            verified = resolver.policy.verify_set(name, data, resolver.clock())
        except PlanCacheError as exc:
            note = f"plan set rejected ({exc.reason}: {exc.detail}); per-plan objects read"
        else:
            results = [PlanResult(vp.fingerprint, "store", vp.plan_bytes, vp.sig_bytes, verified=vp) for vp in verified.plans]
            persisted = {r.fingerprint: r for r in resolver._persist(results)}
            return persisted[fp].with_note(f"plan set {verified.statement.set_id}")
    try:
        results = {r.fingerprint: r for r in resolver.pull(list(dict.fromkeys(world)), deadline)}
    except PlanCacheError as exc:
        return PlanResult(fp, "store", error=exc, note=note)
    return results[fp].with_note(note)


def outcome_path(directory: Path) -> Path:
    return directory.parent / (directory.name + OUTCOME_SUFFIX)


def _record(directory: Path, name: str, result: PlanResult) -> None:
    """What this rank's fetch came to, for the ranks waiting on the lock (best effort)."""
    error = result.error
    outcome = {"set": name, "at": time.time(), "applied": result.verified is not None,
               "reason": error.reason.value if error is not None else "", "detail": error.detail if error is not None else ""}
    try:
        write_atomic(outcome_path(directory), json.dumps(outcome).encode("utf-8"), sync_dir=False)
    except (OSError, PlanCacheError):
        pass


def _recorded(directory: Path, name: str, since: float, fp: str) -> PlanResult | None:
    """The fetching rank's outcome for this set, recorded after this rank began to wait; None
    if there is none (then this rank reads the store itself). It can only make a rank profile:
    a plan is only ever applied from verified bytes, which a hit would have found locally."""
    try:
        raw = read_capped(outcome_path(directory), MAX_OUTCOME_BYTES)
        got = json.loads(raw) if raw else None
    except (OSError, ValueError, PlanCacheError):
        return None
    if not isinstance(got, dict) or got.get("set") != name or not isinstance(got.get("at"), (int, float)):
        return None
    if got["at"] < since:
        return None
    note = "the node's fetching rank found no usable plan; not read again"
    reason, detail = got.get("reason"), safe_text(got.get("detail", ""), 300)
    if not reason:
        return PlanResult(fp, "store", note=note)
    try:
        code = Reason(reason)
    except ValueError:
        code = Reason.STORE_ERROR
    return PlanResult(fp, "store", error=StoreError(detail, reason=code), note=note)
