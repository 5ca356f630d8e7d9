"""One store read per node for each of its worlds: the boot-storm path beside
:class:`Resolver.resolve`.

Every rank of a world computes every rank's fingerprint, hence the name of their plan set
(:mod:`plancache.trust.plans.plan_set`). So on a local miss, a rank takes that set's node lock
(the node's :func:`plancache.storage.local.directory_lock.locked`, on
``startup_plan.<set id>`` beside vLLM's plan directory: one lock per set name, so ranks of other
worlds, or ranks that fell back to their own one-member set, never wait on a fetch that is not
theirs), looks locally again, and only then reads the store once for the world:

* the set object (this node's replica, else the set itself): verified in the trust core, then
  written into vLLM's plan directory only where a rank's local plan is missing or does not
  verify (:meth:`Resolver.fill_gaps`): a set fills gaps, it never replaces a rank's valid plan;
* anything else (no set, a replica or set that S3 answers ``403 AccessDenied`` for because the
  reader may not list, too large, refused, a transient failure with budget left): the per-plan
  objects of the ranks whose plan is missing locally, fetched together, verified, written the
  same way, within the same deadline. A set never makes a boot worse than a store without one.
  Only a store that throttled the set read (429, 503), or a deadline already spent, is asked
  for nothing more: the node profiles, as it would have.

The other ranks of the world wait on the set's lock within their deadline and find a local
hit. A rank that waited and finds none never reads the store itself: it takes its own member's
outcome, recorded by the fetching rank beside the lock (:data:`OUTCOME_SUFFIX`, per set name),
so the ranks of a node decide alike and a refusing store gets one request per node, not one per
rank. Only when no usable outcome for it was recorded after it began to wait (the fetching rank
died; a plan verified but could not be written) does a waiting rank read the store itself. A lock
that cannot be taken safely (a foreign or unopenable lock file, ``unsafe-directory`` or
``lock-unavailable``) makes the rank read for itself, as a node without locks would: bounded by
its deadline, never a wait on a lock it cannot trust, never a boot worse than without sets.

A per-plan object S3 answers 403 for stays that plan's ``store-error``, as for ``Resolver.resolve``:
plancache cannot tell an absent object from a denied one, and the detail names AccessDenied for
the operator. It is that rank's outcome only: the other ranks' plans are still read and written.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...clock import Deadline
from ...storage.deadline import JOIN_GRACE, store_error
from ...storage.local.directory_lock import locked
from ...storage.local.files import read_capped, write_atomic
from ...storage.plan_set_objects import read_set, throttled
from ...trust import strictjson
from ...trust.display import safe_text
from ...trust.errors import PlanCacheError, Reason, StoreError, StoreTimeout
from ...trust.plans.plan_set import VerifiedSet
from ...trust.plans.plan_set_names import replica_name, set_id_of_name, set_name
from ...trust.result import PlanResult
from ..resolver import verify_result

if TYPE_CHECKING:
    from ..resolver import Resolver

OUTCOME_SUFFIX = ".plancache-fetch.json"
"""Beside vLLM's plan directory, one per set name (``startup_plan.<set id>.plancache-fetch.json``,
beside that set's lock), never in it (the directory keeps vLLM's layout): the last node fetch of
that set, its wall-clock time and each fetched member's outcome."""

MAX_OUTCOME_BYTES = 32 * 1024
"""64 members' outcomes with their details cut to :data:`DETAIL_CHARS`: about 14 KiB."""

DETAIL_CHARS = 160

OUTCOME_SKEW = 5.0
"""Seconds an outcome's time may lie ahead of this node's clock (a step of the clock between the
write and the read); beyond, it is ignored: a time in the future would be fresh forever."""

LOCK_MARGIN = 0.25
"""Seconds a waiting rank waits beyond the fetching rank's latest end, for its verify and writes."""


def replica_of(node: str, replicas: int) -> int:
    """Which copy of a set this node reads: a stable hash of its identity (its host name), so
    a fleet spreads evenly over the copies and a node reads the same copy every boot."""
    if replicas <= 1:
        return 0
    return (
        int.from_bytes(hashlib.sha256(node.encode("utf-8", "replace")).digest()[:8], "big")
        % replicas
    )


def set_key(directory: Path, name: str) -> Path:
    """``startup_plan.<set id>`` beside vLLM's plan directory: the stem of that set's lock
    (``.plancache.lock``) and outcome (:data:`OUTCOME_SUFFIX`); a name, never a directory."""
    return directory.with_name(f"{directory.name}.{set_id_of_name(name) or 'invalid'}")


def resolve_node(
    resolver: Resolver, fp: str, world: Sequence[str], deadline: Deadline, *, replica: int = 0
) -> PlanResult:
    """This rank's verified plan, the store read at most once per node for ``world``'s plans.

    ``world`` is every rank's fingerprint in rank order (``fp`` among them); ``replica`` the copy
    of the set to read (:func:`replica_of`; a copy that cannot be read falls back to the set
    itself). Local first, as :meth:`Resolver.resolve`; a policy that reads no store never gets
    here."""
    local = resolver.local(fp)
    if local.verified is not None or not resolver.reads_store:
        return local
    directory = resolver.directory.path
    name = set_name(world)
    key = set_key(directory, name)
    asked = deadline.clock.wall()
    alone = ""
    with ExitStack() as stack:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            waited = _lock(stack, key, deadline)
        except StoreTimeout as exc:
            return PlanResult(
                fp, "store", error=exc, note="waited for the node's fetching rank of this plan set"
            )
        except (OSError, StoreError) as exc:  # no lock to be had safely: this rank reads for itself
            waited, alone = (
                False,
                f"node lock not taken ({_why(exc)}); the store read by this rank alone",
            )
        again = resolver.local(fp)
        if again.verified is not None:
            return again.with_note("fetched by another rank of this node") if waited else again
        if waited:
            recorded = _recorded(key, name, asked, deadline.clock.wall(), fp)
            if recorded is not None:
                return recorded
        try:
            results, note = _fetch(resolver, fp, world, name, deadline, replica)
        except Exception as exc:
            results, note = {}, ""
            results[fp] = PlanResult(
                fp, "store", error=store_error("cannot fetch the plan set", exc)
            )
        _record(key, name, results, deadline.clock.wall())
    result = results.get(fp) or PlanResult(
        fp, "store", error=StoreError("the node fetch did not cover this rank")
    )
    result = result.with_note(alone).with_note(note)
    if local.error is not None:
        return result.with_note(f"local plan rejected ({local.error.reason}: {local.error.detail})")
    return result


def _why(exc: BaseException) -> str:
    return (
        f"{exc.reason}: {exc.detail}"
        if isinstance(exc, PlanCacheError)
        else safe_text(str(exc), 200)
    )


def _lock(stack: ExitStack, key: Path, deadline: Deadline) -> bool:
    """Take the set's node lock; True if another rank held it (this rank waited). A read-only
    filesystem yields no lock (nobody writes there): this rank then reads for itself."""
    try:
        stack.enter_context(locked(key.parent, key, wait=0))
        return False
    except StoreTimeout:
        pass
    # the fetching rank may end up to a deadline's join grace after its deadline (an answer
    # that arrived in time, verified and written): waiting as long keeps the node's ranks alike
    remaining = deadline.remaining() + JOIN_GRACE + LOCK_MARGIN
    if remaining <= 0:
        raise StoreTimeout("no time left in the budget to wait for the node's fetching rank")
    stack.enter_context(locked(key.parent, key, wait=remaining, clock=deadline.clock))
    return True


def _fetch(
    resolver: Resolver, fp: str, world: Sequence[str], name: str, deadline: Deadline, replica: int
) -> tuple[dict[str, PlanResult], str]:
    """Each fetched member's result (the set's gaps filled, else the per-plan objects of the
    ranks missing locally), and a note on the set for this rank's decision."""
    members = list(dict.fromkeys(world))
    verified, notes, stop = _read_set(resolver, name, deadline, replica)
    if verified is not None:
        wanted = [
            PlanResult(vp.fingerprint, "store", vp.plan_bytes, vp.sig_bytes, verified=vp)
            for vp in verified.plans
        ]
        return {r.fingerprint: r for r in resolver.fill_gaps(wanted)}, "; ".join(
            [*notes, f"plan set {verified.statement.set_id}"]
        )
    note = "; ".join(notes)
    if stop is not None:  # throttled, or no time left: the store is asked for nothing more
        return {m: PlanResult(m, "store", error=stop) for m in members}, note
    note = f"{note}; per-plan objects read" if note else note
    gaps = [m for m in members if m == fp or resolver.local(m).verified is None]
    try:
        fetched = resolver.store.fetch_many(gaps, deadline)
    except PlanCacheError as exc:
        return {m: PlanResult(m, "store", error=exc) for m in gaps}, note
    now = resolver.clock()
    return {
        r.fingerprint: r
        for r in resolver.fill_gaps(
            [
                resolver.another_candidate(verify_result(r, resolver.policy, now), now, deadline)
                for r in fetched
            ]
        )
    }, note


def _read_set(
    resolver: Resolver, name: str, deadline: Deadline, replica: int
) -> tuple[VerifiedSet | None, list[str], PlanCacheError | None]:
    """The verified set (this node's replica, else the set itself), else None with a note per
    copy that failed; the error, too, when the store must not be asked again in this budget."""
    notes: list[str] = []
    for obj in ([replica_name(name, replica)] if replica else []) + [name]:
        try:
            data = read_set(resolver.store, obj, deadline)
            if data is not None:
                return resolver.policy.verify_set(name, data, resolver.clock()), notes, None
        except PlanCacheError as exc:
            what = (
                "rejected"
                if exc.reason not in (Reason.STORE_ERROR, Reason.TIMEOUT, Reason.CONFIG)
                else "unread"
            )
            label = "plan set" if obj == name else f"plan set replica {replica}"
            notes.append(f"{label} {what} ({exc.reason}: {safe_text(exc.detail, 300)})")
            if throttled(exc) or deadline.expired():
                return None, notes, exc
    return None, notes, None


def outcome_path(directory: Path, name: str | None = None) -> Path:
    """Where the node fetch of set ``name`` records its outcome, beside vLLM's plan ``directory``;
    without a name (tools, tests), the most recent such file there (or where none is)."""
    if name is not None:
        key = set_key(directory, name)
        return key.with_name(key.name + OUTCOME_SUFFIX)
    found = sorted(directory.parent.glob(f"{directory.name}.*{OUTCOME_SUFFIX}"), key=_mtime)
    return found[-1] if found else directory.with_name(directory.name + OUTCOME_SUFFIX)


def _mtime(path: Path) -> float:
    try:
        return path.lstat().st_mtime
    except OSError:
        return 0.0


def _record(key: Path, name: str, results: dict[str, PlanResult], at: float) -> None:
    """What this rank's fetch came to for each member, for the ranks waiting on the lock (best
    effort)."""
    members = {
        fp: {
            "applied": r.verified is not None,
            "reason": r.error.reason.value if r.error is not None else "",
            "detail": safe_text(r.error.detail, DETAIL_CHARS) if r.error is not None else "",
        }
        for fp, r in results.items()
    }
    outcome = {"set": name, "at": at, "members": members}
    try:
        write_atomic(
            key.with_name(key.name + OUTCOME_SUFFIX),
            json.dumps(outcome).encode("utf-8"),
            sync_dir=False,
        )
    except (OSError, PlanCacheError):
        pass


def _recorded(key: Path, name: str, since: float, now: float, fp: str) -> PlanResult | None:
    """The fetching rank's outcome for this rank's member, recorded after this rank began to
    wait; None if there is none usable (then this rank reads the store itself). It can only make
    a rank profile: a plan is only ever applied from verified bytes, which a hit would have found
    locally. Whatever the file holds (not JSON, NaN, 1e999, deep nesting, wrong types) is never
    more than no record: it is parsed strictly and nothing of it raises."""
    try:
        raw = read_capped(key.with_name(key.name + OUTCOME_SUFFIX), MAX_OUTCOME_BYTES)
        entry = (
            _entry(strictjson.loads(raw, "the node fetch's outcome"), name, since, now, fp)
            if raw
            else None
        )
    except (OSError, PlanCacheError, ValueError, TypeError, OverflowError, RecursionError):
        return None
    if entry is None:
        return None
    reason, detail = entry
    note = "the node's fetching rank found no usable plan; not read again"
    if not reason:
        return PlanResult(fp, "store", note=note)
    try:
        code = Reason(reason)
    except ValueError:
        code = Reason.STORE_ERROR
    return PlanResult(fp, "store", error=StoreError(safe_text(detail, 300), reason=code), note=note)


def _entry(got: Any, name: str, since: float, now: float, fp: str) -> tuple[str, str] | None:
    """(reason, detail) of ``fp``'s member in a parsed outcome that is this set's, recorded at a
    finite time between ``since`` and now; None for anything else, or for a member applied (its
    plan should be local: if it is not, this rank reads for itself)."""
    if not isinstance(got, dict) or got.get("set") != name:
        return None
    at = got.get("at")
    if isinstance(at, bool) or not isinstance(at, (int, float)):
        return None
    at = float(at)  # an int past a float's range raises OverflowError: no record
    if not math.isfinite(at) or not since <= at <= now + OUTCOME_SKEW:
        return None
    members = got.get("members")
    entry = members.get(fp) if isinstance(members, dict) else None
    if not isinstance(entry, dict) or entry.get("applied") is not False:
        return None
    reason, detail = entry.get("reason"), entry.get("detail")
    if not isinstance(reason, str) or not isinstance(detail, str):
        return None
    return reason, detail
