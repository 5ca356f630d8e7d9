"""A cache's precompiled headers: shipped signed by its build node, installed verified by a new
node.

Inductor builds its precompiled header (``<hash>.h.gch``, 149 MiB, 11-60 s of gcc) before it
loads even a warm cache; a node that pulled its cache would otherwise build it on its first
boot. So the build node pushes the header(s) its compile used beside the cache
(:func:`push_headers`: one gzip stream and a statement signed on its own,
:mod:`plancache.trust.compile_cache.header_statement`), and a node that pulled the cache installs
them (:func:`pull_headers`) into its private headers directory, where torch looks for them by name,
only beside the cache signature they were made for (the statement binds that cache's
``archive_sha256``; the node names the one it holds: at once, or for a fetch beside the guard's
pull, in :meth:`Cancel.release`):

signature GET (capped) -> verify (and the binding, when the cache is known) -> every header
already there: done, no object GET -> object GET capped at the signed size -> its signed
sha256 -> inflate each header into a private temporary, hashing what is written (bounded by the
signed sizes: no gzip bomb) -> its signed sha256 -> the binding, against the cache that was
loaded -> link to its name only if the name is free (never replaced, never followed).

Anything wrong leaves nothing installed and is an outcome, never an exception: torch then
builds the header itself, as it always did. A store without header objects (written before
them) is ``none``. Nothing here parses a header: gcc does, and only the verified bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from ...clock import Deadline
from ...storage.compile_cache import archives
from ...storage.compile_cache import header_files as files
from ...storage.store import Store
from ...trust.compile_cache.header_statement import (
    MAX_SIG_OBJECT_BYTES,
    HeaderEntry,
    HeaderSet,
    check_binding,
    is_header_name,
    sign_headers,
    verify_headers,
)
from ...trust.display import safe_text
from ...trust.errors import PlanCacheError, Reason, Rejected
from ...trust.keyring.keys import Keyring, Signer, signer_keyring
from ..directory_signing import signing_moment
from . import shipping_check


@dataclass(frozen=True)
class HeadersOutcome:
    """What one headers flow did (a log line, or a note on the CLI's pull row)."""

    action: str
    """``pushed``, ``installed``, ``present`` (all already on the node: nothing fetched),
    ``none`` (the store has no headers for this cache), ``rejected`` or ``failed`` (then torch
    builds them)."""
    reason: str = ""
    detail: str = ""
    installed: tuple[str, ...] = ()
    present: tuple[str, ...] = ()
    size: int = 0
    """Bytes installed (pull) or shipped compressed (push)."""

    def line(self) -> str:
        """``key=value`` fields for a log line."""
        return (
            f"headers={self.action} reason={self.reason or 'verified'} "
            f"installed={len(self.installed)} present={len(self.present)} bytes={self.size}"
        )


class Cancel:
    """Whether the fetch may still install. ``set`` by a waiter that stopped waiting (torch is
    building that header now, and a link must not race gcc's own write) or by the guard when
    the cache pulled beside it is not loaded; ``held`` (a fetch started while the guard still
    pulls its cache) links nothing until :meth:`release` (the cache was loaded: which one) or
    ``set``."""

    def __init__(self, *, held: bool = False) -> None:
        self._cond = threading.Condition()
        self._cancelled: HeadersOutcome | None = None
        self._held = held
        self._released: str | None = None

    def set(self, outcome: HeadersOutcome | None = None) -> None:
        """From now on nothing is installed; the fetch ends as ``outcome`` (default: timeout)."""
        with self._cond:
            if self._cancelled is None:
                self._cancelled = outcome or HeadersOutcome(
                    "failed",
                    Reason.TIMEOUT.value,
                    "past its budget: torch builds the header itself",
                )
            self._cond.notify_all()

    def release(self, archive_sha256: str | None = None) -> None:
        """The cache was loaded: the one whose signed manifest commits to ``archive_sha256`` (the
        fetch links only headers bound to it; None, unknown: it links nothing)."""
        with self._cond:
            self._held = False
            self._released = archive_sha256
            self._cond.notify_all()

    def released(self) -> str | None:
        """The loaded cache's ``archive_sha256`` given to :meth:`release` (None: not known)."""
        with self._cond:
            return self._released

    def outcome(self) -> HeadersOutcome | None:
        """How the fetch ends once set (None while it may go on)."""
        with self._cond:
            return self._cancelled

    def check(self) -> None:
        """Stop the fetch once set: it stops at its next step, GETs and inflating included, so a
        cache that was not loaded costs its header at most one piece more.

        Raises:
            Cancelled: :meth:`set` was called; it carries the outcome the fetch ends as.
        """
        with self._cond:
            if self._cancelled is not None:
                raise Cancelled(self._cancelled)

    @contextlib.contextmanager
    def unless_cancelled(self, deadline: Deadline | None = None) -> Iterator[bool]:
        """True while neither set nor held: held, wait for the decision (at most to ``deadline``;
        undecided then, nothing is installed)."""
        with self._cond:
            left = None if deadline is None else max(0.0, deadline.remaining())
            self._cond.wait_for(lambda: self._cancelled is not None or not self._held, left)
            if self._cancelled is None and self._held:
                self._cancelled = HeadersOutcome(
                    "failed",
                    Reason.TIMEOUT.value,
                    "the cache's guard did not decide within the headers' budget",
                )
            yield self._cancelled is None


class Cancelled(Exception):
    """Raised by :meth:`Cancel.check` inside a fetch; :func:`pull_headers` returns its outcome."""

    def __init__(self, outcome: HeadersOutcome) -> None:
        super().__init__(outcome.detail)
        self.outcome = outcome


def pack_headers(
    base: Path, directory: Path, names: list[str]
) -> tuple[bytes, list[tuple[str, int, str]]]:
    """Compress the named headers of ``directory`` (this build node's own: ~3.5 s for 149 MiB,
    which the plugin does as soon as gcc built the header, not at exit)."""
    names = sorted(n for n in set(names) if is_header_name(n))
    if not names:
        return b"", []
    fd = files.open_private_dir(base, directory)
    try:
        return files.compress(fd, names)
    finally:
        os.close(fd)


def push_headers(
    store: Store,
    subject: str,
    base: Path,
    directory: Path,
    names: list[str],
    signer: Signer,
    now: datetime,
    *,
    cache_archive_sha256: str,
    expires_in: timedelta | None = None,
    deadline: Deadline | None = None,
    packed: tuple[bytes, list[tuple[str, int, str]]] | None = None,
) -> HeadersOutcome:
    """Sign what the named headers of ``directory`` are (``packed``: compressed already), bound to
    the cache signature they were built beside (its manifest's ``cache_archive_sha256``: the one
    this node just pushed), upload the stream, then its signature (a node never sees a signature
    before its object). Headers that carry a secret or private path of this node beyond ``base``
    (gcc records the paths it read) are neither signed nor pushed.

    Raises:
        Rejected: reason ``private-data`` (:mod:`.shipping_check`), naming what and which header.
    """
    data, entries = packed if packed is not None else pack_headers(base, directory, names)
    if not entries:
        return HeadersOutcome("none", detail="no precompiled header was used")
    shipping_check.check_headers(data, [e[:2] for e in entries], shipping_check.this_node([base]))
    now = signing_moment(signer, now)  # keyless: when it signs, after the cache's upload
    hset = HeaderSet(
        subject,
        tuple(HeaderEntry(*e) for e in entries),
        hashlib.sha256(data).hexdigest(),
        len(data),
        now,
        now + expires_in if expires_in else None,
        cache_archive_sha256=cache_archive_sha256,
    )
    sig = sign_headers(hset, signer)
    verify_headers(
        subject, sig, signer_keyring(signer), now, cache_archive_sha256=cache_archive_sha256
    )
    archives.put_object(store, archives.headers_name(subject), data, deadline=deadline)
    archives.put_object(store, archives.headers_sig_name(subject), sig, deadline=deadline)
    shipped = tuple(e[0] for e in entries)
    return HeadersOutcome(
        "pushed",
        detail=f"{len(shipped)} header(s), {hset.total_size} bytes as {len(data)}",
        installed=shipped,
        size=len(data),
    )


def pull_headers(
    store: Store,
    subject: str,
    keyring: Keyring,
    now: datetime,
    base: Path,
    directory: Path,
    *,
    cache_archive_sha256: str | None,
    deadline: Deadline | None = None,
    cancel: Cancel | None = None,
    owner: Callable[[], str] = lambda: "",
) -> HeadersOutcome:
    """Install the store's verified headers for ``subject`` into ``directory`` (see the module),
    only if they were made for the cache this node holds: ``cache_archive_sha256``, its verified
    manifest's (a pull that kept a newer local cache names that one, so the store's older header
    is refused), else (None) the one ``cancel`` is released with. Never raises for a hostile or
    failing store: the outcome says what torch must build. ``owner`` names, when the
    temporaries are made, the boot directory of the process writing them ("" for none: the CLI),
    asked then because a worker's may be made while the fetch runs
    (:func:`..storage.local.dirfds.temp_name`)."""
    cancel = cancel or Cancel()
    try:
        return _pull(
            store,
            subject,
            keyring,
            now,
            base,
            directory,
            deadline,
            cancel,
            cache_archive_sha256,
            owner,
        )
    except Cancelled as exc:
        return exc.outcome
    except Rejected as exc:  # an alert even once cancelled: the store's header was refused
        return HeadersOutcome("rejected", exc.reason.value, exc.detail)
    except PlanCacheError as exc:
        # A GET that timed out or failed after the cancel: the cancel ended it.
        return cancel.outcome() or HeadersOutcome("failed", exc.reason.value, exc.detail)
    except Exception as exc:
        return cancel.outcome() or HeadersOutcome(
            "failed", Reason.STORE_ERROR.value, safe_text(exc, 200)
        )


def _pull(
    store: Store,
    subject: str,
    keyring: Keyring,
    now: datetime,
    base: Path,
    directory: Path,
    deadline: Deadline | None,
    cancel: Cancel,
    bound: str | None,
    owner: Callable[[], str],
) -> HeadersOutcome:
    sig = archives.get_object(
        store, archives.headers_sig_name(subject), MAX_SIG_OBJECT_BYTES, deadline=deadline
    )
    if sig is None:
        return HeadersOutcome(
            "none", "no-headers", "the store holds no precompiled headers for this cache"
        )
    hset = verify_headers(subject, sig, keyring, now, cache_archive_sha256=bound).headers
    cancel.check()
    fd = files.open_private_dir(base, directory)
    try:
        for h in hset.headers:  # gcc's unfinished file: replaced from the store, never "present"
            files.remove_unfinished(fd, h.name)
        there = {h.name: files.present(fd, h.name) for h in hset.headers}
        taken = tuple(n for n, kind in there.items() if kind)
        if len(taken) == len(hset.headers):
            return _outcome((), taken, there, 0)
        cancel.check()
        data = archives.get_object(
            store, archives.headers_name(subject), hset.object_size, deadline=deadline
        )
        cancel.check()
        if data is None:
            return HeadersOutcome(
                "failed", Reason.STORE_ERROR.value, "the headers' object is missing from the store"
            )
        if len(data) != hset.object_size or hashlib.sha256(data).hexdigest() != hset.object_sha256:
            raise Rejected(
                Reason.DIGEST_MISMATCH,
                "the headers' object does not match its signed sha256 (altered?)",
            )
        return _inflate(fd, files.Inflater(data), hset, there, cancel, deadline, bound, owner())
    finally:
        os.close(fd)


def _inflate(
    fd: int,
    inflater: files.Inflater,
    hset: HeaderSet,
    there: dict[str, str],
    cancel: Cancel,
    deadline: Deadline | None,
    bound: str | None,
    owner: str,
) -> HeadersOutcome:
    """Every header is inflated and checked (the stream is one), then, once the guard loaded the
    cache (``cancel`` released) and only if the statement binds the cache loaded, the free names
    linked."""
    staged: list[tuple[str, str]] = []
    try:
        for entry in hset.headers:
            tmp, digest = inflater.write_into(
                fd, entry.name, entry.size, check=cancel.check, owner=owner
            )
            staged.append((tmp, entry.name))
            if digest != entry.sha256:
                raise Rejected(
                    Reason.DIGEST_MISMATCH,
                    f"the header {entry.name} does not match its signed sha256",
                )
        inflater.finish()
        installed, size = [], 0
        with cancel.unless_cancelled(deadline) as going_on:
            if not going_on:
                cancel.check()
            # The cache loaded (None: unknown, refused).
            check_binding(hset, bound if bound is not None else cancel.released())
            for (tmp, name), entry in zip(staged, hset.headers, strict=True):
                if not there[name] and files.link(fd, tmp, name):
                    installed.append(name)
                    size += entry.size
        taken = tuple(n for n in there if n not in installed)
        return _outcome(tuple(installed), taken, there, size)
    finally:
        for tmp, _ in staged:
            files.discard(fd, tmp)


def _outcome(
    installed: tuple[str, ...], taken: tuple[str, ...], there: dict[str, str], size: int
) -> HeadersOutcome:
    odd = [f"'{n}' is a {there[n]}, left alone" for n in taken if there[n] not in ("", "file")]
    action = "installed" if installed else "present"
    detail = "; ".join(odd) or ("already on this node" if not installed else "")
    return HeadersOutcome(action, "", detail, installed, taken, size)
