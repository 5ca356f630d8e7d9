"""A plan mirror on any fsspec URL (``s3://``, ``gs://``, ``file://``, ``memory://``, ...).

The store moves bytes and decides nothing: :meth:`Store.fetch_many` returns raw plan and
sidecar bytes for the trust core to verify, :meth:`Store.put_many` uploads what the caller
hands it. The remote layout mirrors vLLM's directory: ``<prefix>/startup_plan_<fp>.json`` and
its ``.sig``.

What it does guarantee is bounded cost, whatever the store does:

* every read is capped at ``cap + 1`` bytes, SDK-read bodies too (:mod:`.caps.http`); on
  ``file://`` a name that is not a regular file is rejected without a blocking open;
* listings come page by page and yield fingerprints, never paths (:mod:`.listing`); whole-store
  work streams (:meth:`Store.iter_fingerprints`, :meth:`Store.fetch_stream`);
* every operation runs under one deadline (:mod:`.deadline`), opening a GCS filesystem
  (credential discovery) included; blocking calls run in daemon threads (:mod:`.threads`).

The calls every operation goes through (the filesystem, its loop, bounded batches) are
:mod:`.store_calls`, shared with the modules that move a store's other objects.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..clock import Clock, Deadline
from ..trust.errors import PlanCacheError, Reason, Rejected
from ..trust.plans.plan import fingerprint_of_plan_name, plan_name, sig_name
from ..trust.result import PlanResult
from .backends import CONCURRENCY, filesystem_opener, kind_of
from .capped_reads import read_object
from .deadline import DEFAULT_TIMEOUT, checked_budget, with_retries
from .listing import MAX_NAMES, MAX_PAGES, ObjectInfo, cap_for
from .local.files import write_atomic
from .s3.direct import MAX_FINGERPRINTS, S3Direct, direct_settings
from .store_calls import SYNC_CONCURRENCY, StoreCalls
from .threads import Pending, in_thread

FetchedPair = tuple[bytes | None, bytes | None]
"""A fingerprint's plan and sidecar bytes as fetched (``(None, None)``: no plan)."""


def open_store(
    url: str,
    storage_options: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    *,
    deadline: Deadline | None = None,
    check: Callable[[], None] | None = None,
) -> Store:
    """Open the store at ``url``; ``timeout`` is the overall budget of each remote operation.

    Options: plancache's defaults for the protocol, overridden by fsspec's configuration for
    it, overridden by options in the URL, overridden by ``storage_options``. Bad options fail
    here; a GCS filesystem (and s3fs's, behind :mod:`.s3.direct`) is made by its first use.

    The SDK's import (s3fs, gcsfs, adlfs: up to a second on a busy machine) and ``check`` (the
    caller's look at the options, which imports them too) run in a daemon thread waited for
    until ``deadline`` (default: now + the budget); the first operation without a deadline of its
    own ends by it too, so ``--timeout`` holds for the import, not just the requests after it.

    Raises:
        ConfigError: a budget that is not a positive number of seconds, a URL or options the
            backend cannot take, a backend not installed (reason ``config-error``).
        StoreTimeout: the import or ``check`` did not end by ``deadline`` (reason ``timeout``).
    """
    budget = checked_budget(timeout)
    deadline = Deadline.after(budget) if deadline is None else deadline

    def opening() -> Store:
        if check is not None:
            check()
        return _opened(url, storage_options, budget, deadline.clock)

    store = Pending(opening, "plancache-open").result(deadline, f"cannot open {url}", budget)
    store._first_deadline = deadline
    store.clock = deadline.clock
    return store


def _opened(
    url: str, storage_options: Mapping[str, Any] | None, budget: float, clock: Clock
) -> Store:
    direct = direct_settings(url, storage_options or {})
    if direct is not None:

        def make_s3fs() -> Any:  # s3fs is imported only when more than a boot's few reads ask
            return filesystem_opener(url, storage_options, budget)[1]()

        return Store(
            None,
            url.rstrip("/"),
            direct.root,
            budget,
            kind="s3",
            direct=S3Direct(direct, budget),
            opener=make_s3fs,
        )
    cls, make, root = filesystem_opener(url, storage_options, budget, clock=clock)
    if kind_of(cls) == "gcs":
        return Store(None, url.rstrip("/"), root, budget, opener=make, kind="gcs")
    return Store(make(), url.rstrip("/"), root, budget)


class Store(StoreCalls):
    """Plans and sidecars under one prefix of an fsspec filesystem, with bounded operations.

    ``fs`` is the filesystem, or None when ``opener`` makes it at first use; ``url`` the store's
    URL and ``root`` its prefix as a path of the filesystem; ``timeout`` the budget of each
    operation. ``kind`` picks the read and listing path: ``s3``, ``gcs``, ``azure``, ``oci``
    (registries), ``local`` (``file://``, read without fsspec), ``async`` or ``sync`` (other
    fsspec filesystems; sync in daemon threads). ``direct`` reads a few fingerprints on
    ``s3://`` before s3fs is needed (:mod:`.s3.direct`). How each call is bounded:
    :mod:`.store_calls`.
    """

    def __init__(
        self,
        fs: Any,
        url: str,
        root: str,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        opener: Callable[[], Any] | None = None,
        kind: str | None = None,
        direct: S3Direct | None = None,
    ) -> None:
        super().__init__(fs, url, root, timeout=timeout, opener=opener, kind=kind, direct=direct)

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"Store({self.url!r}, timeout={self.timeout})"

    async def _read_capped(
        self, name: str, deadline: Deadline, cap: int | None = None
    ) -> bytes | None:
        """One object's bytes (None if absent), at most ``cap`` (see
        :func:`.capped_reads.read_object`)."""
        return await read_object(self, name, deadline, cap=cap)

    # -- reads ------------------------------------------------------------------------------

    def iter_objects(self, deadline: Deadline | None = None) -> Iterator[ObjectInfo]:
        """Plan and sidecar objects directly under the prefix, one page requested at a time.

        Every other name is dropped, and so is a name listed again (each object counts once
        everywhere: verify, ls, pull, prune). The deadline bounds the whole listing (it starts
        now, not at the first item).

        Raises:
            Rejected: past MAX_NAMES names or MAX_PAGES pages, while iterating (reason
                ``too-large``).
            StoreError: a page could not be listed (``StoreTimeout`` at the deadline).
        """
        deadline = self._deadline(deadline)

        def pages() -> Iterator[ObjectInfo]:
            token: str | None = None
            names = 0
            seen: set[str] = set()  # at most MAX_NAMES short names
            for _ in range(MAX_PAGES):
                page = self._list_page(token, deadline)
                for info in page.entries:
                    names += 1
                    if names > MAX_NAMES:
                        raise Rejected(
                            Reason.TOO_LARGE, f"{self.url} lists more than {MAX_NAMES} plan objects"
                        )
                    if info.name not in seen:  # a listing naming an object twice names it once
                        seen.add(info.name)
                        yield info
                if page.token is None:
                    return
                token = page.token
            raise Rejected(
                Reason.TOO_LARGE, f"the listing of {self.url} runs past {MAX_PAGES} pages"
            )

        return pages()

    def list_objects(self, deadline: Deadline | None = None) -> dict[str, ObjectInfo]:
        """Plan and sidecar objects directly under the prefix (at most MAX_NAMES of them)."""
        return {info.name: info for info in self.iter_objects(deadline)}

    def iter_fingerprints(self, deadline: Deadline | None = None) -> Iterator[str]:
        """Fingerprints of the plans under the prefix as listed, page by page (not sorted)."""
        objects = self.iter_objects(deadline)
        return (
            fp for fp in (fingerprint_of_plan_name(info.name) for info in objects) if fp is not None
        )

    def fingerprints(self, deadline: Deadline | None = None) -> list[str]:
        """Fingerprints of the plans under the prefix, sorted; hostile names are ignored."""
        return sorted(set(self.iter_fingerprints(deadline)))

    def fetch_stream(
        self,
        fingerprints: Iterable[str],
        deadline: Deadline | None = None,
        on_done: Callable[[int], None] | None = None,
    ) -> Iterator[PlanResult]:
        """:meth:`fetch_many` in batches of the store's concurrency, yielded as each batch ends.

        For whole-store work: ``fingerprints`` may be :meth:`iter_fingerprints`, read one
        batch ahead, so memory holds one batch of results however large the store. One
        deadline for everything (it starts now); results past it carry StoreTimeout.
        """
        deadline = self._deadline(deadline)
        size = CONCURRENCY if self._async else SYNC_CONCURRENCY
        source = iter(fingerprints)

        def batches() -> Iterator[PlanResult]:
            while batch := list(itertools.islice(source, size)):
                yield from self.fetch_many(batch, deadline, on_done)

        return batches()

    def fetch_many(
        self,
        fingerprints: Sequence[str],
        deadline: Deadline | None = None,
        on_done: Callable[[int], None] | None = None,
    ) -> list[PlanResult]:
        """Plan and sidecar bytes of each fingerprint, both requested at once, in input order.

        Raw and unverified. A plan that is absent is a result with no bytes and no error; one
        that failed carries its typed error; at the deadline, those not yet fetched carry
        StoreTimeout and those already fetched are kept.

        Raises:
            Rejected: a fingerprint that is not 16 hex digits, before any request (reason
                ``malformed``).
        """
        for fp in fingerprints:
            plan_name(fp)  # validates every fingerprint before anything touches the network
        deadline = self._deadline(deadline)

        async def pair(fp: str) -> FetchedPair:
            import asyncio  # here, not at import: a boot's blocking read never loads it

            # both outcomes are collected: a failure of one read must not leave the other's
            # exception unretrieved (asyncio would print its traceback at exit)
            plan, sig = await asyncio.gather(
                self._read_capped(plan_name(fp), deadline),
                self._read_capped(sig_name(fp), deadline),
                return_exceptions=True,
            )
            if isinstance(plan, BaseException):
                raise plan
            if isinstance(sig, BaseException):
                raise sig
            return (None, None) if plan is None else (plan, sig)

        unique = list(dict.fromkeys(fingerprints))
        got: Mapping[str, FetchedPair | PlanCacheError]
        if self._direct is not None and self._fs is None and len(unique) <= MAX_FINGERPRINTS:
            got = self._direct.fetch_pairs(unique, deadline, on_done)
        else:
            got = self._each_by(unique, pair, "fetch", deadline, on_done=on_done)
        return [_result(fp, got[fp]) for fp in fingerprints]

    def fetch(self, fp: str, deadline: Deadline | None = None) -> PlanResult:
        """One fingerprint's plan and sidecar in one round trip (see :meth:`fetch_many`)."""
        return self.fetch_many([fp], deadline)[0]

    # -- writes -----------------------------------------------------------------------------

    def put_many(
        self,
        objects: Mapping[str, bytes],
        deadline: Deadline | None = None,
        on_done: Callable[[int], None] | None = None,
    ) -> None:
        """Upload ``{name: bytes}`` (plan and sidecar names only) concurrently.

        Order among objects is not guaranteed: a reader racing a push may see a new plan with
        an old sidecar, which fails verification (costs a profiling run, never a wrong plan).

        Raises:
            Rejected: a name that is not a plan's, sidecar's or plan set's (reason
                ``malformed``), or bytes over its cap (``too-large``), before any upload.
            StoreError: the first upload that failed (``StoreTimeout`` at the deadline).
        """
        for name in objects:
            cap = cap_for(name)
            if len(objects[name]) > cap:
                raise Rejected(Reason.TOO_LARGE, f"{name} is larger than {cap} bytes")
        deadline = self._deadline(deadline)

        async def upload(name: str) -> None:
            if self.kind == "local":
                # temp file and rename: a FIFO planted at the name is replaced, never opened
                await in_thread(write_atomic, Path(self.path(name)), objects[name])
                return
            await with_retries(
                lambda: self._call("pipe_file", self.path(name), objects[name]), deadline
            )

        _raise_first(
            self._each_by(list(objects), upload, f"upload to {self.url}", deadline, on_done=on_done)
        )

    def put(
        self, fp: str, plan_bytes: bytes, sig_bytes: bytes | None, deadline: Deadline | None = None
    ) -> None:
        """Upload one plan and, when given, its sidecar (concurrently)."""
        objects = {plan_name(fp): plan_bytes}
        if sig_bytes is not None:
            objects[sig_name(fp)] = sig_bytes
        self.put_many(objects, deadline)

    def delete(self, fingerprints: Iterable[str], deadline: Deadline | None = None) -> None:
        """Delete plans and their sidecars; objects already gone are not an error."""
        self.delete_objects(
            [n for fp in fingerprints for n in (plan_name(fp), sig_name(fp))], deadline
        )

    def delete_objects(self, names: list[str], deadline: Deadline | None = None) -> None:
        """Delete these objects under the prefix (plans, sidecars, plan sets); gone is not an
        error."""
        deadline = self._deadline(deadline)

        async def remove(name: str) -> None:
            with contextlib.suppress(FileNotFoundError):
                await with_retries(lambda: self._call("rm_file", self.path(name)), deadline)

        _raise_first(self._each_by(names, remove, f"delete from {self.url}", deadline))


def _result(fp: str, outcome: FetchedPair | PlanCacheError) -> PlanResult:
    if isinstance(outcome, PlanCacheError):
        return PlanResult(fp, "store", error=outcome)
    return PlanResult(fp, "store", plan_bytes=outcome[0], sig_bytes=outcome[1])


def _raise_first(results: Mapping[str, object]) -> None:
    for outcome in results.values():
        if isinstance(outcome, PlanCacheError):
            raise outcome
