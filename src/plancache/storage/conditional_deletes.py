"""Deleting only what was judged: ``prune`` removes an object only if it is still the one it read.

Judging a store takes a while (a listing, every plan fetched and verified), and a plan can be
re-pushed meanwhile: a delete by name would remove the new plan. So right before the delete,
each plan and sidecar is read again and compared with what was judged (:func:`content_digest`).
On S3, GCS and Azure that re-read also takes each object's version (ETag, generation) and the
delete is conditional on it (:mod:`.versioned`): an object replaced even after the re-read is
kept by the store itself (412), and reported as ``changed``, never as an error. One already
gone (404) is fine. The plan goes first, then its sidecar, each conditional: a plan that
changed keeps its sidecar; a sidecar replaced after its plan's delete is kept, beside no plan
(a sidecar alone is never listed as a plan).

Several S3-compatible servers accept ``If-Match`` on a delete and ignore it (as
gcp-storage-emulator ignores ``ifGenerationMatch``): there the precondition would be a promise
the store does not keep. So before the first delete, :func:`require_honoured_preconditions`
asks the store: it writes a canary object beside the plans (a name no listing takes for a
plan), deletes it with a precondition that does not hold, and requires that delete to fail
(412); a store that deletes it anyway, or refuses the precondition itself, is a ConfigError
and nothing is deleted. ``unconditional=True`` (``prune --unconditional``) skips the check and
deletes after the re-read, as on the backends below.

Other backends (``file://``, ``memory://``, other fsspec filesystems) offer no precondition
through fsspec (:attr:`.backend.Backend.preconditions` says which do; the registry does, on its
manifest digests): they are re-read and compared, and the window left is the time between that
re-read and the delete.

Every call runs under the caller's deadline on the store's event loop, retried inside it with
:func:`.deadline.with_retries`, and failures are typed (:func:`.deadline.store_error`).
"""

from __future__ import annotations

import hashlib
import itertools
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from ..clock import Deadline
from ..trust.errors import ConfigError, PlanCacheError, Reason, Rejected
from ..trust.plans.plan import plan_name, sig_name
from .deadline import http_status, store_error, with_retries
from .listing import cap_for
from .versioned import ABSENT, Versioned, precondition_failed

if TYPE_CHECKING:
    from .backend import Backend
    from .store import Store

T = TypeVar("T")

BATCH = 64
"""Fingerprints re-read, then deleted, per round."""

CANARY_PREFIX = ".plancache-precondition-check-"
"""Name of the canary object the precondition check writes and deletes (never a plan's name)."""

UNCONDITIONAL_FLAG = "--unconditional"

BeforeDelete = Callable[[list[str]], None]
"""Called with the fingerprints about to be deleted, after their re-read (tests race a writer
here)."""


def content_digest(plan_bytes: bytes | None, sig_bytes: bytes | None) -> str:
    """What a plan and its sidecar held, as one sha256 (an absent sidecar differs from an empty
    one)."""
    digest = hashlib.sha256()
    for part in (plan_bytes, sig_bytes):
        digest.update(b"-" if part is None else b"%d:" % len(part) + part)
    return digest.hexdigest()


def delete_if_unchanged(
    store: Store,
    judged: Mapping[str, str],
    *,
    deadline: Deadline | None = None,
    before_delete: BeforeDelete | None = None,
    unconditional: bool = False,
    versions: dict[str, str] | None = None,
    checked: bool = False,
) -> tuple[list[str], list[str]]:
    """Delete each fingerprint's plan and sidecar only if both are still what was judged
    (``judged`` maps a fingerprint to its :func:`content_digest`); returns (deleted, changed).
    ``versions``, if given, gets each deleted plan's version (what its delete was conditional
    on: a registry's manifest digest, an ETag, a generation; none without preconditions).
    ``checked``: this store already passed :func:`require_honoured_preconditions` in this run
    (``prune``'s later rounds), so no canary is written again.

    Re-reads one batch at a time and compares; on S3, GCS and Azure each delete is then
    conditional on the version re-read (see the module docs), once the store has shown that it
    honours that precondition; elsewhere, or with ``unconditional``, it follows the re-read.
    A read or delete that fails raises its typed error (what was deleted before stays deleted):
    a ``StoreError`` (``StoreTimeout`` at the deadline), or ``Rejected`` (reason ``too-large``)
    for an object re-read over its cap; a store that does not honour the precondition is
    :func:`require_honoured_preconditions`' ConfigError.
    """
    deadline = Deadline.after(store.timeout, store.clock) if deadline is None else deadline
    if not store.backend.preconditions or unconditional:
        return _reread_then_delete(store, judged, deadline, before_delete)
    if not checked:
        require_honoured_preconditions(store, deadline)
    backend = store.backend
    deleted: list[str] = []
    changed: list[str] = []
    source = iter(judged)
    while batch := list(itertools.islice(source, BATCH)):
        done, kept = _delete_batch(store, backend, batch, judged, deadline, before_delete, versions)
        deleted += done
        changed += kept
    return deleted, changed


def _delete_batch(
    store: Store,
    backend: Backend,
    batch: list[str],
    judged: Mapping[str, str],
    deadline: Deadline,
    before_delete: BeforeDelete | None,
    versions: dict[str, str] | None,
) -> tuple[list[str], list[str]]:
    """One batch of :func:`delete_if_unchanged` on a store with preconditions: re-read, compare,
    delete conditionally; (deleted, changed)."""
    seen = _each(
        store, batch, lambda fp: _read_pair(store, backend, fp, deadline), "re-read", deadline
    )
    same = [fp for fp in batch if content_digest(seen[fp][0].data, seen[fp][1].data) == judged[fp]]
    changed = [fp for fp in batch if fp not in same]
    if same and before_delete is not None:
        before_delete(same)
    gone = _each(
        store,
        same,
        lambda fp: _delete_pair(store, backend, fp, seen[fp], deadline),
        "delete",
        deadline,
    )
    changed += [fp for fp in same if not gone[fp]]
    if versions is not None:
        versions.update((fp, seen[fp][0].token or "") for fp in same if gone[fp])
    return [fp for fp in same if gone[fp]], changed


def require_honoured_preconditions(store: Store, deadline: Deadline) -> None:
    """Require the store to refuse a delete whose precondition does not hold: checked on a
    canary object, written and removed here.

    Raises:
        ConfigError: the store deleted the canary anyway, or refused the precondition itself,
            naming :data:`UNCONDITIONAL_FLAG` (reason ``config-error``).
        StoreError: the store failed the check itself (``StoreTimeout`` at the deadline).
    """
    backend = store.backend
    path = store.path(f"{CANARY_PREFIX}{uuid.uuid4().hex}")

    async def check() -> str | None:
        await with_retries(lambda: backend.write(path, b"plancache precondition check\n"), deadline)
        try:
            token = (
                await with_retries(lambda: backend.read_versioned(path, 64), deadline)
            ).token or ""
            wrong = (
                str(int(token) + 1) if token.isdigit() else f'"plancache-{uuid.uuid4().hex}"'
            )  # never the canary's
            try:
                await backend.delete_if_unchanged(path, wrong)
            except Exception as exc:
                if precondition_failed(exc):
                    return None
                status = http_status(exc)
                if status is None or (status >= 500 and status != 501):
                    raise  # the store failed, not the check: a store error
                return f"answers {status} to a delete with a precondition"
            return "deleted an object whose precondition did not hold"
        finally:
            await with_retries(lambda: backend.delete(path), deadline)

    failed = store.run(check, deadline, "cannot check conditional deletes on")  # typed there
    if failed is not None:
        raise ConfigError(
            f"{store.url} does not honour conditional deletes (it {failed}), so a plan replaced "
            f"after it was judged could be deleted; nothing deleted (prune {UNCONDITIONAL_FLAG} "
            "deletes anyway, after a re-read)"
        )


def _reread_then_delete(
    store: Store, judged: Mapping[str, str], deadline: Deadline, before_delete: BeforeDelete | None
) -> tuple[list[str], list[str]]:
    """No precondition: re-read, compare, delete what is the same (the window stays)."""
    deleted: list[str] = []
    changed: list[str] = []
    stream = store.fetch_stream(list(judged), deadline)
    while batch := list(itertools.islice(stream, BATCH)):
        for r in batch:
            if r.error is not None:
                raise r.error
        same = [
            r.fingerprint
            for r in batch
            if content_digest(r.plan_bytes, r.sig_bytes) == judged[r.fingerprint]
        ]
        if same:
            if before_delete is not None:
                before_delete(same)
            store.delete(same, deadline)
        deleted += same
        changed += [r.fingerprint for r in batch if r.fingerprint not in same]
    return deleted, changed


def _each(
    store: Store,
    keys: Sequence[str],
    action: Callable[[str], Awaitable[T]],
    what: str,
    deadline: Deadline,
) -> dict[str, T]:
    """``action`` on every key through the store's own bounded batch runner; raises the first
    failure."""
    results = store.each(keys, action, f"{what} plans in", deadline)
    done: dict[str, T] = {}
    for key, outcome in results.items():
        if isinstance(outcome, PlanCacheError):
            raise outcome
        done[key] = outcome
    return done


async def _read_pair(
    store: Store, backend: Backend, fp: str, deadline: Deadline
) -> tuple[Versioned, Versioned]:
    import asyncio  # here, not at import: a boot's blocking read never loads it

    plan, sig = await asyncio.gather(
        _read_one(store, backend, plan_name(fp), deadline),
        _read_one(store, backend, sig_name(fp), deadline),
        return_exceptions=True,  # both collected: neither exception is left unretrieved
    )
    if isinstance(plan, BaseException):
        raise plan
    if isinstance(sig, BaseException):
        raise sig
    return plan, sig


async def _read_one(store: Store, backend: Backend, name: str, deadline: Deadline) -> Versioned:
    cap = cap_for(name)
    try:
        got = await with_retries(lambda: backend.read_versioned(store.path(name), cap), deadline)
    except FileNotFoundError:
        return ABSENT
    except Exception as exc:
        raise store_error(f"cannot re-read {name}", exc) from None
    if got.data is not None and len(got.data) > cap:
        raise Rejected(Reason.TOO_LARGE, f"{name} in the store is larger than {cap} bytes")
    return got


async def _delete_pair(
    store: Store, backend: Backend, fp: str, seen: tuple[Versioned, Versioned], deadline: Deadline
) -> bool:
    """False if the plan is no longer the version re-read (then its sidecar stays too)."""
    plan, sig = seen
    if not await _delete_one(store, backend, plan_name(fp), plan.token, deadline):
        return False
    await _delete_one(store, backend, sig_name(fp), sig.token, deadline)
    return True


async def _delete_one(
    store: Store, backend: Backend, name: str, token: str | None, deadline: Deadline
) -> bool:
    """Delete ``name`` if it is still version ``token``: True if deleted or gone, False if
    changed."""
    if token is None:
        return True  # absent at the re-read: nothing judged to delete
    try:
        await with_retries(lambda: backend.delete_if_unchanged(store.path(name), token), deadline)
    except FileNotFoundError:
        return True
    except Exception as exc:
        if precondition_failed(exc):
            return False
        raise store_error(f"cannot delete {name}", exc) from None
    return True
