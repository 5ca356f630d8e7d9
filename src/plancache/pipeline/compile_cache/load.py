"""What the plugin runs before vLLM's first read of a compile cache: pull, verify, copy, or not.

:func:`guard` is the one entry point. Under the node's lock for the directory (so ranks never race:
one pulls, the others wait and then verify what it installed) it pulls a missing cache, verifies a
present one and copies it into the boot's private directory, hashing every byte it writes
(:mod:`plancache.storage.compile_cache.private_copy`). vLLM is then pointed at the copy only: the
signed directory is never read by torch, and never written by it either, so a verified cache stays
verified across restarts. A cache that fails verification is moved aside beside it, on its own
mount; if it cannot be moved, it is simply not loaded. A local failure (a full disk, a permission, a
name already taken, a lock that cannot be had) is no verdict: the cache stays in place and vLLM
compiles, with the reason in the outcome. A cache that fails the same way boot after boot is not
fetched at every boot (:mod:`.fetch_backoff`). Every outcome is a :class:`CacheOutcome`.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from ...clock import Deadline
from ...storage.compile_cache import archives, cachedir, placement, private_copy
from ...storage.local import directory_lock
from ...storage.store import Store
from ...trust.compile_cache.manifest_signature import MAX_SIG_OBJECT_BYTES, verify_manifest
from ...trust.display import safe_text
from ...trust.errors import PlanCacheError, Reason, Rejected, StoreError
from ...trust.keyring.keys import Keyring
from . import fetch_backoff
from .flows import pull_locked
from .local_caches import (
    CacheOutcome,
    CacheRoot,
    check_names,
    has_files,
    outcome_of,
    read_sidecar,
)

Fetch = Callable[[], "tuple[Store, Deadline]"]
"""Opens the store a missing or rejected cache is pulled from, and the pull's deadline."""


def guard(
    root: CacheRoot,
    subject: str,
    keyring: Keyring | None,
    now: datetime,
    into: Path,
    *,
    problem: str = "",
    fetch: Fetch | None = None,
    wait: float | None = None,
) -> CacheOutcome:
    """Before vLLM reads ``subject``, under the node's lock for it (waiting at most ``wait``):
    pull it if it is missing and ``fetch`` is given, verify its signature and closed world, then
    copy it into ``into`` hashing every byte written
    (:mod:`plancache.storage.compile_cache.private_copy`): ``load`` means vLLM must read ``into``,
    and only ``into``. Otherwise ``into`` is left an
    empty directory, and the outcome says why: ``compile`` (``no-cache``, ``store-rejected``, a
    store error, ``timeout`` of the lock) or ``quarantined`` (the local cache was moved aside,
    beside it on its own mount; a store then gets one chance to replace it). ``keyring`` None
    means trusted keys are configured but unusable (``problem`` says why): nothing is trusted.
    Never raises for a hostile cache or store: not loading is always the fallback."""
    directory = root.directory(subject)
    try:
        with directory_lock.locked(root.root, directory, wait=wait):
            return _guard_locked(root, subject, keyring, now, into, problem, fetch)
    except StoreError as exc:  # the lock: held too long by another rank, or not to be had
        return _empty(into, CacheOutcome(subject, "compile", exc.reason.value, exc.detail))
    finally:
        with contextlib.suppress(OSError):  # a full disk: vLLM finds no cache there either way
            into.mkdir(mode=0o700, exist_ok=True)


def _guard_locked(
    root: CacheRoot,
    subject: str,
    keyring: Keyring | None,
    now: datetime,
    into: Path,
    problem: str,
    fetch: Fetch | None,
) -> CacheOutcome:
    directory = root.directory(subject)
    fetch = _once(fetch) if fetch is not None else None
    offered = _StoreSignature(fetch, subject) if fetch is not None else None
    aside = placement.set_aside_lone_sidecar(
        root.root, directory, root.quarantine_root
    )  # then: a missing cache
    note = f"{aside}; " if aside else ""
    if not has_files(directory):
        if fetch is None or keyring is None:
            return CacheOutcome(subject, "compile", "no-cache", f"{note}no compile cache yet")
        assert offered is not None
        held = fetch_backoff.holding(root, subject, now, offered=offered.digest)
        if held:
            return CacheOutcome(subject, "compile", "backoff", f"{note}no compile cache; {held}")
        fetched = _fetch(fetch, offered, root, subject, keyring, now)
        if fetched.action != "compile":
            said = f"{note}store: pulled" + (f" ({fetched.detail})" if fetched.detail else "")
            return _load_pulled(root, subject, keyring, now, into, said)
        return replace(fetched, detail=note + fetched.detail)
    try:
        if keyring is None:
            raise Rejected(Reason.CONFIG, f"trusted keys unusable ({problem})")
        loaded = _load_into(root, subject, keyring, now, into)
        fetch_backoff.clear(root, subject)  # it held since it was put there: no run of failures
        return loaded
    except Rejected as exc:
        rejected = CacheOutcome(subject, "quarantined", exc.reason.value, exc.detail)
    except StoreError as exc:  # a full disk, a permission, a name taken: not a verdict on the cache
        return _empty(
            into,
            CacheOutcome(
                subject, "compile", exc.reason.value, f"{exc.detail}; the signed cache is kept"
            ),
        )
    try:
        target = str(
            cachedir.quarantine(root.root, directory, root.quarantine_root, rejected.reason)
        )
    except StoreError as exc:
        return _empty(
            into,
            replace(
                rejected, detail=f"{rejected.detail}; not moved aside, not loaded ({exc.detail})"
            ),
        )
    rejected = replace(rejected, quarantined_to=target)
    if fetch is None or offered is None or keyring is None:
        fetch_backoff.note(root, subject, f"quarantined:{rejected.reason}", now)
        return rejected
    failure = f"quarantined:{rejected.reason}"
    fetch_backoff.note(root, subject, failure, now, store_sig=offered.digest())
    held = fetch_backoff.holding(root, subject, now, offered=offered.digest)
    if held:
        return replace(rejected, detail=f"{rejected.detail}; {held}")
    fetched = _fetch(fetch, offered, root, subject, keyring, now)
    if fetched.action == "compile":
        return replace(rejected, detail=f"{rejected.detail}; {fetched.detail}")
    pulled = _load_pulled(
        root,
        subject,
        keyring,
        now,
        into,
        f"local cache quarantined ({rejected.reason}); store: pulled"
        + (f" ({fetched.detail})" if fetched.detail else ""),
    )
    return replace(pulled, quarantined_to=target)


def _load_pulled(
    root: CacheRoot, subject: str, keyring: Keyring, now: datetime, into: Path, detail: str
) -> CacheOutcome:
    """What a pull just installed (verified on extraction), verified again while it is copied;
    should even that fail, nothing is loaded and the pulled directory is left to the next boot."""
    try:
        return _load_into(root, subject, keyring, now, into, detail=detail)
    except StoreError as exc:  # the copy failed locally: the pulled cache stays for a later boot
        return _empty(
            into, CacheOutcome(subject, "compile", exc.reason.value, f"{detail}, then {exc.detail}")
        )
    except PlanCacheError as exc:
        return _empty(
            into,
            CacheOutcome(
                subject,
                "compile",
                "store-rejected",
                f"{detail}, then {exc.reason.value}: {exc.detail}",
            ),
        )


def _load_into(
    root: CacheRoot, subject: str, keyring: Keyring, now: datetime, into: Path, *, detail: str = ""
) -> CacheOutcome:
    directory = root.directory(subject)
    verified = verify_manifest(subject, read_sidecar(directory), keyring, now)
    check_names(directory, verified)
    private_copy.copy_verified(directory, into, verified.manifest)
    return outcome_of(subject, "load", verified, detail=detail)


def _once(fetch: Fetch) -> Fetch:
    """``fetch`` opened at most once per guard (the back-off's look at the store's signature
    and the pull share one store and one deadline)."""
    opened: list[tuple[Store, Deadline]] = []

    def call() -> tuple[Store, Deadline]:
        if not opened:
            opened.append(fetch())
        return opened[0]

    return call


class _StoreSignature:
    """The store's signature for one subject, read at most once per guard.

    The back-off compares its sha256 with the one that failed, and the pull verifies the same
    bytes: so a guard never asks the store for the signature twice, and the failure it records
    is the digest of exactly the signature that failed (not of a second read, which a push in
    between could have changed)."""

    def __init__(self, fetch: Fetch, subject: str) -> None:
        self._fetch = fetch
        self._subject = subject
        self._outcome: list[bytes | Exception | None] = []

    def read(self) -> bytes | None:
        """The signature's bytes (None: the store has none).

        Raises:
            Exception: the first read's failure (opening the store, the GET), at every call.
        """
        if not self._outcome:
            try:
                store, deadline = self._fetch()
                self._outcome.append(
                    archives.get_object(
                        store,
                        archives.sig_name(self._subject),
                        MAX_SIG_OBJECT_BYTES,
                        deadline=deadline,
                    )
                )
            except Exception as exc:
                self._outcome.append(exc)
        got = self._outcome[0]
        if isinstance(got, Exception):
            raise got
        return got

    def digest(self) -> str:
        """What the store offers, as the back-off compares it: the signature's sha256;
        ``absent`` when the store has none; ``rejected:<reason>`` for one it offers but that is
        refused unread (over its cap); "" only when the store could not be read (no answer, a
        store error).

        A failure recorded with "" holds the back-off without asking the store again
        (:func:`.fetch_backoff.holding`), so "" is kept for what cannot be known: a writer with
        no signing key who put an oversized signature object (or, for a quarantined cache,
        nothing) under the cache's name would otherwise hide the cache the operator signed
        anew after it until the delay ran out (up to a day)."""
        try:
            sig = self.read()
        except Rejected as exc:
            return f"rejected:{exc.reason.value}"
        except Exception:
            return ""
        return hashlib.sha256(sig).hexdigest() if sig is not None else "absent"


def _empty(into: Path, outcome: CacheOutcome) -> CacheOutcome:
    shutil.rmtree(into, ignore_errors=True)
    return outcome


def _fetch(
    fetch: Fetch,
    offered: _StoreSignature,
    root: CacheRoot,
    subject: str,
    keyring: Keyring,
    now: datetime,
) -> CacheOutcome:
    """Pull into place (the caller holds the lock): the pull's own outcome when a verified
    cache was installed (its detail says, say, that an older candidate attached to the image
    was taken), else ``compile`` and why not: the store has none (``no-cache``), refused what
    it has (``store-rejected``: an alert, not a miss), or failed (``store-error``,
    ``timeout``)."""
    try:
        store, deadline = fetch()
        return pull_locked(
            store, root, subject, keyring, now, deadline, read_signature=offered.read
        )
    except Rejected as exc:
        reason = "no-cache" if exc.reason is Reason.UNSIGNED else "store-rejected"
        if reason == "store-rejected":
            failure = f"store-rejected:{exc.reason.value}"
            fetch_backoff.note(root, subject, failure, now, store_sig=offered.digest())
        return CacheOutcome(subject, "compile", reason, f"store: {exc.reason.value}: {exc.detail}")
    except PlanCacheError as exc:
        return CacheOutcome(subject, "compile", exc.reason.value, f"store: {exc.detail}")
    except Exception as exc:
        return CacheOutcome(
            subject, "compile", Reason.STORE_ERROR.value, f"store: {safe_text(exc, 200)}"
        )
