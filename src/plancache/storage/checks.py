"""Questions asked of a store location around the work, never on a boot's hot path.

* :func:`check_options`: are the storage options ones the backend takes? s3fs hands unknown
  keys to ``AioSession`` at the first request, which then fails with ``AioSession.__init__()
  got an unexpected keyword argument``; naming the option and the backend up front is the
  message an operator can act on. Only backends whose constructors are known are checked
  (s3, gs, file, memory): for any other protocol a key is passed through unjudged.
* :func:`location_exists`: does the bucket (or, for file:// and memory://, the directory)
  exist? Asked only after a listing came back empty, so a healthy store pays nothing; a
  missing bucket lists as empty through fsspec, which is how a typo could pass an audit.
* :func:`require_subject`: does the image a registry store attaches to exist (before a push
  signs anything)?
* :func:`deeper_prefixes`: when a prefix holds no plans, which prefixes below it do (a
  bounded breadth-first walk, best effort), to name them in the error.

They decide nothing about trust and read only names and existence. (Deleting only what was
judged is :mod:`.conditional_deletes`.)
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ..clock import Deadline
from ..settings import unknown_option
from ..trust.errors import ConfigError, PlanCacheError
from ..trust.plans.plan import fingerprint_of_plan_name
from .deadline import run_by

if TYPE_CHECKING:
    from .store import Store

T = TypeVar("T")

BUCKETED = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss")
"""Protocols whose first path component is a bucket (an Azure container) that must exist on its
own."""

_CHECKED = {  # protocol -> the SDK whose constructor takes its options
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "file": "file",
    "local": "file",
    "memory": "memory",
}
_FSSPEC_COMMON = {
    "use_listings_cache",
    "listings_expiry_time",
    "max_paths",
    "skip_instance_cache",
    "asynchronous",
    "loop",
    "batch_size",
}
_PLANCACHE_OWN = {"s3": {"retries"}}
"""Options plancache itself consumes before the SDK sees them (see storage.backends)."""

MAX_LISTINGS = 25
"""Listing requests (directory listings; on S3, GCS and Azure, pages) a deeper-prefix walk
makes, at most."""
MAX_DEPTH = 3
MAX_QUEUED = 100
"""Sub-prefixes a paged deeper-prefix walk keeps to visit, at most."""


def _named_parameters(cls: type) -> set[str]:
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            params = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            continue
        names.update(
            p.name
            for p in params
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"
        )
    return names


def _accepted(sdk: str, cls: type) -> set[str]:
    names = _named_parameters(cls) | _FSSPEC_COMMON | _PLANCACHE_OWN.get(sdk, set())
    if sdk == "s3":  # s3fs passes its remaining keyword arguments to aiobotocore's AioSession
        try:
            from aiobotocore.session import AioSession

            names |= _named_parameters(AioSession)
        except ImportError:
            pass
    return names


def check_options(url: str, options: Mapping[str, Any]) -> None:
    """Check ``options`` against what the backend of ``url`` takes (see the module).

    Raises:
        ConfigError: naming the first option the backend does not take, with the nearest name it
            does (reason ``config-error``).
    """
    protocol = url.split("://", 1)[0].lower()
    if protocol == "oci" and options:
        from .oci.registry_urls import is_registry_url

        if is_registry_url(url):  # plancache's own store: its option table is its own
            from .oci.registry_open import BACKEND as REGISTRY_BACKEND
            from .oci.registry_open import OPTIONS as REGISTRY

            _refuse_unknown(protocol, REGISTRY_BACKEND, REGISTRY, options)
            return
    sdk = _CHECKED.get(protocol)
    if sdk is None or not options:
        return
    if sdk == "s3":
        from .s3.direct import OPTIONS

        if set(options) <= OPTIONS:
            return  # names every s3fs takes: no need to import aiobotocore to say so
    import fsspec

    try:
        if sdk == "gcs":
            from gcsfs.core import GCSFileSystem as cls
        else:
            cls = fsspec.get_filesystem_class(protocol)
    except ImportError:
        return  # the open itself explains the missing extra
    _refuse_unknown(protocol, f"{cls.__module__}.{cls.__name__}", _accepted(sdk, cls), options)


def _refuse_unknown(
    protocol: str, backend: str, accepted: set[str], options: Mapping[str, Any]
) -> None:
    for key in options:
        if key not in accepted:
            raise ConfigError(
                unknown_option(key, protocol=protocol, backend=backend, accepted=accepted)
            )


# -- existence and deeper prefixes ------------------------------------------------------------


def _run(store: Store, make: Callable[[], Awaitable[T]], deadline: Deadline, what: str) -> T:
    """``make()`` on the store's loop by ``deadline``; typed by :func:`.deadline.run_by`
    (no retries: these questions are best effort or asked once)."""
    backend = store.open_backend()
    return run_by(backend.loop, make, deadline, f"{what} {store.url}", store.timeout)


def protocol_of(store: Store) -> str:
    return store.url.split("://", 1)[0].lower()


def location_exists(store: Store, deadline: Deadline | None = None) -> bool | None:
    """True or False; None when the store will not say (access to the bucket itself denied).

    For bucketed protocols the bucket is asked about, since a prefix "exists" only while an
    object is under it; elsewhere the directory itself.

    Raises:
        ConfigError: a file, FIFO, socket or device where the directory should be, looked up,
            never opened (reason ``config-error``).
        StoreError: the store could not be asked (``StoreTimeout`` at the deadline).
    """
    deadline = Deadline.after(store.timeout, store.clock) if deadline is None else deadline
    protocol = protocol_of(store)
    target = store.root.split("/", 1)[0] if protocol in BUCKETED else store.root
    backend = store.backend

    async def info() -> Any:
        try:
            return await backend.info(target)
        except FileNotFoundError:
            return None
        except PermissionError:
            return PermissionError

    found = _run(store, info, deadline, "cannot look up")
    if found is PermissionError:
        return None
    if found is None:
        return False
    if protocol not in BUCKETED and isinstance(found, Mapping) and found.get("type") != "directory":
        if found.get("type") == "file":
            raise ConfigError(
                f"{store.url} is a file, not a directory of plans "
                "(plancache inspect FILE shows one plan)"
            )
        raise ConfigError(
            f"{store.url} is not a directory of plans (a FIFO, socket or device)"
        )  # never opened
    return True


def require_subject(store: Store, deadline: Deadline | None = None) -> None:
    """For a registry store with a ``subject`` (``--subject IMAGE``): the image must exist in
    the repository, asked before ``push`` signs anything (a typo'd tag would otherwise cost a
    signature, or a KMS call, and then fail at the first upload). Any other store: nothing.

    Raises:
        StoreError: the image is not in the repository, or the registry could not be asked
            (``StoreTimeout`` at the deadline).
    """
    if store.subject is None:
        return
    from .oci.registry import RegistryBackend

    registry = store.backend
    assert isinstance(registry, RegistryBackend)  # the only backend with a subject
    deadline = Deadline.after(store.timeout, store.clock) if deadline is None else deadline
    _run(
        store,
        registry.subject_descriptor,
        deadline,
        "cannot look up the --subject image in",
    )


def deeper_prefixes(
    store: Store, *, deadline: Deadline | None = None, limit: int = 5, max_depth: int = MAX_DEPTH
) -> list[str]:
    """URLs of up to ``limit`` prefixes below the store's that hold plans; best effort.

    Breadth first, at most ``max_depth`` levels and MAX_LISTINGS listing requests, inside the
    deadline; any failure ends the walk with what was found so far. On S3, GCS and Azure each
    request is one page (:meth:`.backend.Backend.list_page`), read and dropped: what is kept is
    at most
    MAX_QUEUED prefixes and whether a plan was seen, so a hostile listing (4 MiB pages that say
    "truncated" forever) costs a page of memory, not the listing's size. The URLs are the
    store's text, returned as they are: whoever shows them escapes them
    (:func:`plancache.pipeline.locations.no_plans_message`), so a near-miss is matched on the
    real name.
    """
    deadline = (
        Deadline.after(min(store.timeout, 10.0), store.clock) if deadline is None else deadline
    )
    base = store.url.rstrip("/")
    found: list[str] = []

    def shown(path: str) -> str:
        return base + path[len(store.root.rstrip("/")) :]

    async def paged() -> None:
        queue: deque[tuple[str, int]] = deque([(store.root, 0)])
        queued = requests = 0
        while queue and len(found) < limit and requests < MAX_LISTINGS:
            path, depth = queue.popleft()
            token: str | None = None
            holds_plans = False
            while requests < MAX_LISTINGS:
                requests += 1
                try:
                    page = await backend.list_page(path, token)
                except (OSError, ValueError, PlanCacheError):
                    break
                holds_plans = holds_plans or any(
                    fingerprint_of_plan_name(e.name) for e in page.entries
                )
                for below in page.prefixes if depth < max_depth else ():
                    if queued < MAX_QUEUED:
                        queue.append((below, depth + 1))
                        queued += 1
                if page.token is None or (
                    holds_plans and (queued >= MAX_QUEUED or depth >= max_depth)
                ):
                    break  # nothing more this prefix could tell
                token = page.token
            if depth > 0 and holds_plans:
                found.append(shown(path))

    async def walk() -> None:
        queue = [(store.root, 0)]
        listings = 0
        while queue and len(found) < limit and listings < MAX_LISTINGS:
            path, depth = queue.pop(0)
            listings += 1
            try:
                entries = await backend.list_dir(path)
            except (OSError, ValueError):
                continue
            names = []
            for full, is_directory in entries:
                leaf = full.rsplit("/", 1)[-1]
                if is_directory and depth < max_depth and full != path.rstrip("/"):
                    queue.append((full, depth + 1))
                names.append(leaf)
            if depth > 0 and any(fingerprint_of_plan_name(n) for n in names):
                found.append(shown(path))

    try:
        backend = store.backend
        _run(store, paged if backend.paged else walk, deadline, "cannot walk")
    except PlanCacheError:
        pass
    return found[:limit]
