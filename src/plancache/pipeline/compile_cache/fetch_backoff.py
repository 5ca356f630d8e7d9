"""When a cache that keeps failing the same way is fetched again: not at every boot.

A cache quarantined for the same reason boot after boot (a co-tenant renaming junk over its
sidecar after each install), or a store that keeps serving an archive this node rejects, would
otherwise cost a download and a quarantine entry per boot. The guard records each such failure
(:mod:`plancache.storage.compile_cache.fetch_failures`, in the quarantine directory its
entries go to, durable); from the
second same failure in a row it stops asking the store for :func:`delay` (10 min, doubling
with each further one, at most a day), timed on the ``now`` the guard is given (the caller's
clock). A boot that loads the cache it found in place (not one it just pulled) ends the run.
The back-off holds only while the store still offers what failed: each failure records the
sha256 of the store's signature for the cache then, and a boot inside the delay asks the store
for that signature alone (small, capped): another one (the operator pushed a cache signed
anew) is fetched at once. Otherwise whoever made a cache fail twice (a writer to the bucket
with no signing key, a co-tenant) would hide every good cache pushed after it for up to a day.
Every failure is still told as it happens (the quarantine, the store's rejection: alerts);
a boot inside the delay says ``reason=backoff`` and compiles.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

from ...storage.compile_cache import cachedir, fetch_failures
from ...trust.errors import StoreError
from ...trust.statement import format_time
from .local_caches import CacheRoot

FIRST = timedelta(minutes=10)
LONGEST = timedelta(days=1)


def delay(count: int) -> timedelta:
    """How long the store is not asked after ``count`` same failures in a row (none after one:
    one failure may be a fluke the store's copy repairs)."""
    if count < 2:
        return timedelta(0)
    return min(FIRST * 2 ** min(count - 2, 16), LONGEST)


def note(
    root: CacheRoot, subject: str, failure: str, now: datetime, *, store_sig: str = ""
) -> None:
    """Record that ``subject`` just failed as ``failure`` while the store's signature for it
    had the sha256 ``store_sig`` (or was ``absent``, or ``rejected:<reason>``; "" unknown)
    (best effort: without a record, the cache is only fetched as before). Another signature in
    the store starts a new run."""
    records = fetch_failures.read(root.root, _place(root, subject))
    last = records.get(subject)
    same = last is not None and last.failure == failure and last.store_sig == store_sig
    count = last.count + 1 if last is not None and same else 1
    records[subject] = fetch_failures.Failure(failure, count, now.timestamp(), store_sig)
    with contextlib.suppress(OSError, StoreError):
        fetch_failures.write(root.root, _place(root, subject), records)


def holding(
    root: CacheRoot, subject: str, now: datetime, *, offered: Callable[[], str] = lambda: ""
) -> str:
    """Why the store is not asked for ``subject``'s archive now ("" when it may be): inside the
    delay of its recorded run of same failures, and the store still offers the signature that
    failed (``offered``: the sha256 of the store's signature now, ``absent`` or
    ``rejected:<reason>`` when it has none or one refused unread, "" when it cannot be read;
    asked only inside the delay). A record stamped in the future (a clock set back, a record
    carried over) holds nothing."""
    last = fetch_failures.read(root.root, _place(root, subject)).get(subject)
    if last is None or last.count < 2 or last.at > now.timestamp():
        return ""
    until = datetime.fromtimestamp(last.at, timezone.utc) + delay(last.count)
    if now >= until:
        return ""
    if last.store_sig:
        current = offered()
        if current and current != last.store_sig:
            return ""
    return (
        f"the same failure ({last.failure}) {last.count} times in a row: the store is not "
        f"asked again before {format_time(until)}"
    )


def clear(root: CacheRoot, subject: str) -> None:
    """The cache held between boots: its run of failures is over."""
    records = fetch_failures.read(root.root, _place(root, subject))
    if records.pop(subject, None) is not None:
        with contextlib.suppress(OSError, StoreError):
            fetch_failures.write(root.root, _place(root, subject), records)


def _place(root: CacheRoot, subject: str) -> Path:
    """The quarantine directory the cache's evidence goes to (:func:`.cachedir.quarantine`
    tries :func:`.cachedir.quarantine_roots` in order, skipping another user's): the first of
    them that is this user's, else the first not made yet; on the cache's own mount when
    ``torch_compile_cache/`` is one, else the root's (also while the cache's directory does not
    exist yet: one place, before and after). On a root shared with another uid that made
    ``plancache-quarantine`` first, the record follows the evidence to the fallback instead of
    being lost with every write (the back-off silently off)."""
    directory = root.directory(subject)
    parent = directory.parent
    try:
        other = os.stat(parent).st_dev != os.stat(root.root).st_dev
    except OSError:
        other = False
    first = parent / cachedir.QUARANTINE_SUBDIR if other else root.quarantine_root
    candidates = [first] + [
        place
        for place in cachedir.quarantine_roots(root.root, directory, root.quarantine_root)
        if place != first
    ]
    for place in candidates:
        with contextlib.suppress(OSError):
            st = os.lstat(place)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
                return place
    for place in candidates:
        if not os.path.lexists(place) and os.path.isdir(place.parent):
            return place
    return first
