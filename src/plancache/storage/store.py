"""A plan mirror on any store URL (``s3://``, ``gs://``, ``az://``, ``oci://``, ``file://``, ...).

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
  (credential discovery) included; blocking calls run in daemon threads (:mod:`.threads`);
* many keys at once go through :func:`each`: at most the backend's concurrency in flight, and
  one key's failure never stops the others.

A store holds one backend (:mod:`.backend`: one class per URL scheme) and is the layer
above it where every bound is enforced once: the deadline, the retries, the caps, the typing of
errors, how many calls are in flight. The modules that move a store's other objects
(:mod:`.plan_set_objects`, :mod:`.checks`, :mod:`.conditional_deletes`,
:mod:`.compile_cache.archives`) go through the same calls (:meth:`Store.read`,
:meth:`Store.write_object`, :meth:`Store.run`, :meth:`Store.each`).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..clock import REAL_CLOCK, Clock, Deadline
from ..trust.errors import PlanCacheError, Reason, Rejected
from ..trust.plans.plan import fingerprint_of_plan_name, plan_name, sig_name
from ..trust.result import PlanResult
from .backends import FilesystemClass, filesystem_opener
from .deadline import (
    DEFAULT_TIMEOUT,
    checked_budget,
    http_status,
    run_by,
    store_error,
    with_retries,
)
from .listing import MAX_NAMES, MAX_PAGES, ObjectInfo, Page, cap_for
from .s3.direct import MAX_FINGERPRINTS, S3Direct, direct_settings
from .threads import Pending, use_daemon_executor

if TYPE_CHECKING:
    from .backend import Backend

T = TypeVar("T")

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


def open_backend(
    url: str,
    storage_options: Mapping[str, Any] | None,
    budget: float,
    *,
    clock: Clock = REAL_CLOCK,
) -> tuple[Backend, str]:
    """(the backend of ``url``'s scheme, the store's root as a path of it). Every backend but
    GCS's (credential discovery) and S3's on its boot path (:mod:`.s3.direct`) is opened here;
    those two open at their first call, under that call's deadline (:meth:`Store.backend`).

    Raises:
        ConfigError: :func:`.backends.filesystem_opener`'s, and the opener's own (bad option
            names or values, missing credentials files).
    """
    direct = direct_settings(url, storage_options or {})
    if direct is not None:
        from .s3.s3_backend import S3Backend

        def make_s3fs() -> Any:  # s3fs is imported only when more than a boot's few reads ask
            return filesystem_opener(url, storage_options, budget)[1]()

        return S3Backend(make_s3fs, direct=S3Direct(direct, budget)), direct.root
    cls, make, root = filesystem_opener(url, storage_options, budget, clock=clock)
    return _backend_of(cls, make, url), root


def _backend_of(cls: type | FilesystemClass, make: Callable[[], Any], url: str) -> Backend:
    """The backend class for a filesystem class, by the SDK that defines it, opened now (but
    GCS's)."""
    from .fsspec_backends import FsspecBackend, MemoryBackend

    module = cls.__module__
    backend: Backend
    if module.startswith("plancache.storage.oci"):
        from .oci.registry import RegistryBackend

        registry = make()
        assert isinstance(registry, RegistryBackend)
        return registry
    if module.startswith("gcsfs"):
        from .gcs.gcs_backend import GCSBackend

        return GCSBackend(make, url=url.rstrip("/"))  # opened under its first call's deadline
    if module.startswith("s3fs"):
        from .s3.s3_backend import S3Backend

        backend = S3Backend(make, direct=None)
    elif module.startswith(("adlfs", "plancache.storage.azure")):
        from .azure.azure_backend import AzureBackend

        backend = AzureBackend(make)
    elif module.startswith("fsspec.implementations.local"):
        from .local.local_backend import LocalBackend

        backend = LocalBackend("file", opener=make)
    elif module.startswith("fsspec.implementations.memory"):
        backend = MemoryBackend("memory", opener=make)
    else:
        backend = FsspecBackend(url.split("://", 1)[0].lower(), opener=make)
    backend.open()
    return backend


def _opened(
    url: str, storage_options: Mapping[str, Any] | None, budget: float, clock: Clock
) -> Store:
    backend, root = open_backend(url, storage_options, budget, clock=clock)
    return Store(backend, url.rstrip("/"), root, budget)


async def each(
    keys: Sequence[str],
    action: Callable[[str], Awaitable[T]],
    what: str,
    limit: int,
    on_done: Callable[[int], None] | None,
    results: dict[str, T | PlanCacheError],
) -> None:
    """``action`` on every key, at most ``limit`` at once; each key's result or typed error.

    Actions retry on their own (:func:`~plancache.storage.deadline.with_retries`); a key's
    failure never stops the others. ``results`` fills in as keys finish, so a caller cancelled
    at its deadline still has the ones that did.
    """
    import asyncio  # here, not at import: a boot's blocking read never loads it

    gate = asyncio.Semaphore(limit)

    async def one(key: str) -> None:
        async with gate:
            try:
                results[key] = await action(key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                results[key] = store_error(f"cannot {what} {key}", exc)
        if on_done:
            on_done(1)

    await asyncio.gather(*(one(k) for k in keys))


class Store:
    """Plans and sidecars under one prefix of one backend, with bounded operations.

    ``backend`` moves the bytes (:class:`.backend.Backend`; it is opened at its first use,
    within a budget, if it is not open yet); ``url`` is the store's URL and ``root`` its prefix
    as a path of the backend; ``timeout`` the budget of each operation.
    """

    def __init__(
        self, backend: Backend, url: str, root: str, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self._backend = backend
        self._opening: Pending[None] | None = None
        self._lock = threading.Lock()
        self.url = url
        self.root = root
        self.timeout = timeout
        self._first_deadline: Deadline | None = None
        """The deadline :func:`open_store` waited for: an operation without a deadline of its
        own that starts before it ends by it (the open and that operation share one budget)."""
        self.clock: Clock = REAL_CLOCK
        """What an operation without a deadline of its own measures its budget by: the clock of
        the deadline the store was opened by."""

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"Store({self.url!r}, timeout={self.timeout})"

    # -- what every operation goes through -----------------------------------------------------

    @property
    def scheme(self) -> str:
        """The backend's URL scheme (``s3``, ``gcs``, ``azure``, ``oci``, ``file``, ...), for
        messages."""
        return self._backend.scheme

    @property
    def subject(self) -> str | None:
        """The image every object of the store is attached to (a registry store's
        ``--subject``): a name may then stand for several objects (:mod:`.oci.candidate_reads`);
        None for every other store."""
        return self._backend.subject

    def served_from(self) -> list[tuple[str, str]]:
        """(host, where configured) of each mirror this store's reads went through in this
        process (``via_mirror``); none for a store read from its URL only."""
        return self._backend.served_from()

    @property
    def backend(self) -> Backend:
        """The backend, as it is (open or not: every call through the store opens it first)."""
        return self._backend

    def open_backend(self, deadline: Deadline | None = None) -> Backend:
        """The backend, opened now if it is not open yet, within ``deadline`` (default: one
        budget).

        Raises:
            PlanCacheError: the opening failed (its typed error; ``StoreTimeout`` past the
                deadline).
        """
        return self._open(
            Deadline.after(self.timeout, self.clock) if deadline is None else deadline
        )

    def _open(self, deadline: Deadline) -> Backend:
        """The backend, opened at most once, in a daemon thread, waited for until
        ``deadline``."""
        backend = self._backend
        if not backend.opened:
            with self._lock:
                if self._opening is None:
                    self._opening = Pending(backend.open, f"plancache-open-{backend.scheme}")
            self._opening.result(deadline, f"cannot open {self.url}", self.timeout)
        return backend

    def path(self, name: str) -> str:
        """The backend's path of ``name`` under the store's prefix."""
        return (
            f"{self.root}/{name}"
            if self.root not in ("", "/")
            else f"{self.root.rstrip('/')}/{name}"
        )

    def beside(self, url: str, root: str) -> Store:
        """A store at another prefix (``url``, ``root``) of the same backend, opened now within
        one budget (its errors), with this store's budget."""
        return Store(self.open_backend(), url, root, self.timeout)

    def deadline(self, deadline: Deadline | None) -> Deadline:
        """``deadline`` if given; else the opening's, while it lasts, for the first operation
        (the open and that operation share one budget); else a fresh budget on the store's
        clock."""
        if deadline is not None:
            return deadline
        first = self._first_deadline
        self._first_deadline = None
        if first is not None and not first.expired():
            return first
        return Deadline.after(self.timeout, self.clock)

    def run(self, make: Callable[[], Awaitable[T]], deadline: Deadline, what: str) -> T:
        """``make()`` on the backend's event loop until ``deadline`` (the backend opened
        first); ``what`` starts the message of its errors (:func:`.deadline.run_by`'s)."""
        backend = self._open(deadline)
        loop = backend.loop
        use_daemon_executor(loop)
        return run_by(loop, make, deadline, f"{what} {self.url}", self.timeout)

    def each(
        self,
        keys: Sequence[str],
        action: Callable[[str], Awaitable[T]],
        what: str,
        deadline: Deadline,
        *,
        on_done: Callable[[int], None] | None = None,
    ) -> dict[str, T | PlanCacheError]:
        """:func:`each` from a synchronous caller, at most the backend's concurrency at once;
        keys not done at the deadline get its StoreTimeout."""
        if not keys:
            return {}
        done: dict[str, T | PlanCacheError] = {}
        limit = self._backend.concurrency

        async def everything() -> None:
            await each(keys, action, what, limit, on_done, done)

        try:
            self.run(everything, deadline, f"cannot {what}")
        except PlanCacheError as exc:
            return {key: done.get(key, exc) for key in keys}
        return done

    async def read_capped(
        self, name: str, deadline: Deadline, cap: int | None = None
    ) -> bytes | None:
        """One object's bytes (None if absent), at most ``cap`` (a plan's or sidecar's by its
        name); retried while transient, inside ``deadline``; on the backend's loop.

        Raises:
            Rejected: the object is larger than the cap (reason ``too-large``); no cap given
                and a name that is not a plan's, sidecar's or plan set's (``malformed``).
            PlanCacheError: every other failure typed (:func:`.deadline.store_error`).
        """
        import asyncio  # here, not at import: a boot's blocking read never loads it

        cap = cap_for(name) if cap is None else cap
        path = self.path(name)
        backend = self._backend
        try:
            data = await with_retries(lambda: backend.read(path, cap), deadline)
        except FileNotFoundError:
            return None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if http_status(exc) == 416:  # a range from byte 0 fails only over an empty object
                return b""
            raise store_error(f"cannot read {name}", exc) from None
        if data is not None and len(data) > cap:
            raise Rejected(Reason.TOO_LARGE, f"{name} in the store is larger than {cap} bytes")
        return data

    def read(self, name: str, deadline: Deadline, *, cap: int | None = None) -> bytes | None:
        """:meth:`read_capped` from a synchronous caller, waited for until ``deadline`` (its
        errors, ``StoreTimeout`` at the deadline); before the backend is open, through its
        direct reads where it has them (``s3://``: :mod:`.s3.direct`, no s3fs import)."""
        backend = self._backend
        direct = backend.direct if not backend.opened else None
        if direct is not None:
            return direct.get(name, cap, deadline)
        return self.run(
            lambda: self.read_capped(name, deadline, cap), deadline, f"cannot read {name} from"
        )

    def write_object(self, name: str, data: bytes, deadline: Deadline) -> None:
        """Upload one object under the prefix within the deadline (retrying transient
        failures); a failure is a ``StoreError`` (``StoreTimeout`` at the deadline)."""
        path = self.path(name)
        backend = self._backend
        self.run(
            lambda: with_retries(lambda: backend.write(path, data), deadline),
            deadline,
            f"cannot upload {name} to",
        )

    def folder_names(self, folder: str, deadline: Deadline) -> list[str]:
        """The names directly under ``folder`` (below the prefix; a compile-cache folder, a
        few entries), listed whole; none if it is absent."""
        base = self.path(folder)
        backend = self._backend

        async def listing() -> list[tuple[str, bool]]:
            try:
                return await with_retries(lambda: backend.list_dir(base), deadline)
            except FileNotFoundError:
                return []

        return [
            path.rstrip("/").rpartition("/")[2]
            for path, _ in self.run(listing, deadline, "cannot list")
        ]

    def list_page(self, token: str | None, deadline: Deadline) -> Page:
        """One page of the listing, from ``token`` (None: the first), retried inside
        ``deadline``; an absent prefix lists nothing."""
        backend = self._backend

        async def page() -> Page:
            try:
                return await backend.list_page(self.root, token)
            except FileNotFoundError:
                return Page([], None)

        return self.run(lambda: with_retries(page, deadline), deadline, "cannot list")

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
        deadline = self.deadline(deadline)

        def pages() -> Iterator[ObjectInfo]:
            token: str | None = None
            names = 0
            seen: set[str] = set()  # at most MAX_NAMES short names
            for _ in range(MAX_PAGES):
                page = self.list_page(token, deadline)
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
        deadline = self.deadline(deadline)
        size = self._backend.concurrency
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
        deadline = self.deadline(deadline)

        async def pair(fp: str) -> FetchedPair:
            import asyncio  # here, not at import: a boot's blocking read never loads it

            # both outcomes are collected: a failure of one read must not leave the other's
            # exception unretrieved (asyncio would print its traceback at exit)
            plan, sig = await asyncio.gather(
                self.read_capped(plan_name(fp), deadline),
                self.read_capped(sig_name(fp), deadline),
                return_exceptions=True,
            )
            if isinstance(plan, BaseException):
                raise plan
            if isinstance(sig, BaseException):
                raise sig
            return (None, None) if plan is None else (plan, sig)

        unique = list(dict.fromkeys(fingerprints))
        got: Mapping[str, FetchedPair | PlanCacheError]
        direct = self._backend.direct if not self._backend.opened else None
        if direct is not None and len(unique) <= MAX_FINGERPRINTS:
            got = direct.fetch_pairs(unique, deadline, on_done)
        else:
            got = self.each(unique, pair, "fetch", deadline, on_done=on_done)
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
        deadline = self.deadline(deadline)

        backend = self._backend

        async def upload(name: str) -> None:
            await with_retries(lambda: backend.write(self.path(name), objects[name]), deadline)

        _raise_first(
            self.each(list(objects), upload, f"upload to {self.url}", deadline, on_done=on_done)
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
        deadline = self.deadline(deadline)

        backend = self._backend

        async def remove(name: str) -> None:
            await with_retries(lambda: backend.delete(self.path(name)), deadline)

        _raise_first(self.each(names, remove, f"delete from {self.url}", deadline))


def _result(fp: str, outcome: FetchedPair | PlanCacheError) -> PlanResult:
    if isinstance(outcome, PlanCacheError):
        return PlanResult(fp, "store", error=outcome)
    return PlanResult(fp, "store", plan_bytes=outcome[0], sig_bytes=outcome[1])


def _raise_first(results: Mapping[str, object]) -> None:
    for outcome in results.values():
        if isinstance(outcome, PlanCacheError):
            raise outcome
