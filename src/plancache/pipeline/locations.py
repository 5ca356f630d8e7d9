"""Where plans are: a local directory (vLLM's plan directory by default) or a store URL.

Both answer the same two questions -- which fingerprints are there, and what are the raw
bytes of each plan and sidecar (``fetch_many``, as :class:`~plancache.trust.result.PlanResult)
-- so auditing, listing and pruning do not care which. fsspec is imported only for a URL.

A location that lists no plans is asked why (:func:`require_existing`, :func:`deeper`): a
bucket or directory that does not exist is a ConfigError (exit 2), never an empty, passing
audit; one that exists but is empty is named with the prefixes below it that hold plans.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from ..clock import REAL_CLOCK
from ..settings import BULK_TIMEOUT
from ..storage.local.localdir import LocalPlanDir, default_plan_dir
from ..trust.errors import ConfigError
from ..trust.plans.plan import fingerprint_of_plan_name

if TYPE_CHECKING:
    from ..clock import Deadline
    from ..storage.store import Store


DEEPER_SHOWN = 5
"""Prefixes holding plans named when the given one holds none."""
STORE_SCHEMES = frozenset(
    ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "oci", "file", "memory", "http", "https")
)
"""Schemes that, written with one slash (``oci:/host/repo``), are a store URL's typo rather than
a directory's name."""
SIBLINGS_SEEN = 50
"""Prefixes holding plans looked at beside the given one, for a near-miss suggestion."""

Location = Union[LocalPlanDir, "Store"]

__all__ = [
    "BULK_TIMEOUT",
    "Location",
    "deeper",
    "is_url",
    "local_dir",
    "no_plans_message",
    "normalise_url",
    "open_location",
    "open_url",
    "require_existing",
    "require_push_target",
    "require_url",
    "storage_options_for",
]


def is_url(location: str | None) -> bool:
    return bool(location) and "://" in str(location)


def normalise_url(url: str) -> str:
    """The URL with its scheme in lower case (``S3://b`` is ``s3://b``; bucket names keep
    theirs)."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme.lower()}{sep}{rest}" if sep else url


def require_url(url: str) -> str:
    """``url`` with its scheme normalised, once it is known to be a store URL.

    Raises:
        ConfigError: ``url`` has no scheme (``not a store URL``; ``config-error``).
    """
    if not is_url(url):
        raise ConfigError(f"not a store URL: {url!r} (expected e.g. s3://bucket/prefix)")
    return normalise_url(url)


def storage_options_for(
    explicit: Mapping[str, Any] | None, env: Mapping[str, str] = os.environ
) -> dict[str, Any]:
    """``$PLANCACHE_STORAGE_OPTIONS`` overridden, key by key, by the options a caller names
    (``--storage-option`` flags, the Python API's ``storage_options``): the CLI and the API
    read the same environment, and what is said explicitly wins.

    Raises:
        ConfigError: ``$PLANCACHE_STORAGE_OPTIONS`` does not parse (``config-error``).
    """
    from ..settings import STORAGE_OPTIONS_ENV, parse_storage_options

    options: dict[str, Any] = {}
    raw = env.get(STORAGE_OPTIONS_ENV, "").strip()
    if raw:
        try:
            options = parse_storage_options(raw)
        except ValueError as exc:
            raise ConfigError(f"{STORAGE_OPTIONS_ENV}: {exc}") from None
    options.update(explicit or {})
    return options


def open_url(
    url: str,
    storage_options: Mapping[str, Any] | None,
    timeout: float,
    *,
    deadline: Deadline | None = None,
) -> Store:
    """The store at ``url``, after checking that its backend takes every storage option given
    (both within ``deadline``, default now + ``timeout``: see
    :func:`~..storage.store.open_store`).

    Raises:
        ConfigError: ``url`` is not a store URL, or its backend refuses a storage option
            (raised by :func:`require_url` and the store's checks; ``config-error``).
    """
    started = REAL_CLOCK.monotonic()  # read before importing the storage machinery: it counts
    from ..clock import Deadline
    from ..storage.checks import check_options
    from ..storage.deadline import checked_budget
    from ..storage.store import open_store

    url = require_url(url)
    deadline = Deadline(started, checked_budget(timeout)) if deadline is None else deadline
    return open_store(
        url,
        storage_options,
        timeout,
        deadline=deadline,
        check=lambda: check_options(url, storage_options or {}),
    )


def local_dir(location: str | os.PathLike[str] | None, must_exist: bool = True) -> LocalPlanDir:
    """A plan directory (default: vLLM's, resolved as vLLM resolves it).

    Raises:
        ConfigError: the path is a file, or (with ``must_exist``) not a directory
            (``config-error``).
    """
    path = Path(location).expanduser() if location else default_plan_dir()
    if path.is_file():
        raise ConfigError(
            f"{path} is a file, not a plan directory (plancache inspect {path} shows one plan)"
        )
    if must_exist and not path.is_dir():
        raise ConfigError(f"plan directory {path} does not exist{_url_with_one_slash(location)}")
    return LocalPlanDir(path)


def _url_with_one_slash(location: str | os.PathLike[str] | None) -> str:
    """``; did you mean 'oci://host/repo'?`` when a missing directory is spelled like a store URL
    short of a slash (``oci:/host/repo``, ``s3:bucket``): read as a path it would only ever be
    "does not exist", which hides the typo."""
    match = re.fullmatch(r"([A-Za-z][A-Za-z0-9+.-]+):/?([^/].*)", str(location or ""))
    if match is None or match.group(1).lower() not in STORE_SCHEMES:
        return ""
    return f"; did you mean '{match.group(1).lower()}://{match.group(2)}'?"


def open_location(
    location: str | os.PathLike[str] | None,
    storage_options: Mapping[str, Any] | None = None,
    timeout: float | None = None,
) -> Location:
    """A directory, or for a URL the store itself (the same ``fingerprints``/``fetch_many``)."""
    if is_url(str(location) if location else None):
        return open_url(
            str(location), storage_options, BULK_TIMEOUT if timeout is None else timeout
        )
    return local_dir(location)


def require_existing(source: Location, deadline: Deadline | None = None) -> None:
    """ConfigError when the location itself (bucket, directory) does not exist.

    Called after a listing came back empty: fsspec lists a missing bucket as empty, and a
    mistyped bucket must not pass an audit.

    Raises:
        ConfigError: the plan directory, the bucket or the store's location does not exist
            (``config-error``).
    """
    if isinstance(source, LocalPlanDir):
        if not source.path.is_dir():
            raise ConfigError(f"plan directory {source.path} does not exist")
        return
    from ..storage.checks import BUCKETED, location_exists, protocol_of

    if location_exists(source, deadline) is False:
        if protocol_of(source) in BUCKETED:
            bucket = source.root.split("/", 1)[0]
            raise ConfigError(f"{source.url}: bucket {bucket!r} does not exist")
        raise ConfigError(f"{source.url} does not exist")


def require_push_target(store: Store) -> None:
    """ConfigError when a ``file://`` store's parent directory does not exist. A push creates
    the store's own directory (a new store), but a whole missing tree is a mistyped mount path
    (``file:///mnt/plnas/fleet``), and creating it would hide every plan from the nodes that
    read the real one.

    For a registry store with ``--subject``, the image must exist in its repository
    (:func:`..storage.checks.require_subject`), asked before anything is signed.

    Raises:
        ConfigError: the parent directory of a ``file://`` store does not exist
            (``config-error``).
        StoreError: the ``--subject`` image is not in the registry store's repository.
    """
    if store.subject is not None:
        from ..storage.checks import require_subject

        require_subject(store)  # the image attached to exists, before anything is signed
        return
    if store.url.split("://", 1)[0].lower() not in ("file", "local"):
        return
    parent = Path(store.root or "/").parent
    if not parent.is_dir():
        raise ConfigError(
            f"{store.url}: {parent} does not exist (a push creates the store's own directory, "
            "not a whole missing tree: is the mount path right?)"
        )


def deeper(source: Location, limit: int = DEEPER_SHOWN) -> list[str]:
    """Up to ``limit`` directories or prefixes below ``source`` that hold plans (best effort)."""
    if isinstance(source, LocalPlanDir):
        return _deeper_dirs(source.path, limit)
    from ..storage.checks import deeper_prefixes

    return deeper_prefixes(source, limit=limit)  # its default: the store's budget, 10 s at most


def no_plans_message(source: Location) -> str:
    """ "no plans in X", naming the prefixes below X that hold some, else a sibling whose name is
    close to X's (``…/h10`` when ``…/h100`` holds plans)."""
    from ..trust.display import safe_text  # the names below come from the store: hostile text

    image = attached_to(source)
    if image is not None:  # only the image's referrers were listed: deeper prefixes say nothing
        return f"nothing is attached to image {safe_text(image, 300)} in {source} (--subject)"
    below = deeper(source)
    if below:
        shown = ", ".join(safe_text(b, 300) for b in below)
        return f"no plans in {source}; plans found below it in: {shown}"
    near = near_miss(source)
    return f"no plans in {source}" + (
        f"; did you mean {safe_text(near, 300)} (it holds plans)?" if near else ""
    )


def attached_to(source: Location) -> str | None:
    """The image a registry store lists the referrers of (``--subject``), else None."""
    return None if isinstance(source, LocalPlanDir) else source.subject


def near_miss(source: Location) -> str | None:
    """The sibling of ``source`` (same parent) nearest in name that holds plans, if one is near
    enough to be the one meant; best effort, within the source's budget (10 s at most)."""
    import difflib

    if isinstance(source, LocalPlanDir):
        leaf, holding = (
            source.path.name,
            _deeper_dirs(source.path.parent, SIBLINGS_SEEN, max_depth=1),
        )
    else:
        from ..clock import Deadline
        from ..storage.checks import deeper_prefixes

        parent_url, _, leaf = source.url.rstrip("/").rpartition("/")
        parent_root = source.root.rstrip("/").rpartition("/")[0]
        if not parent_root or "://" not in parent_url or parent_url.endswith("://"):
            return None
        try:
            parent = source.beside(parent_url, parent_root)
        except Exception:  # best effort: the filesystem could not be made in time
            return None
        holding = deeper_prefixes(
            parent,
            deadline=Deadline.after(min(source.timeout, 10.0), source.clock),
            limit=SIBLINGS_SEEN,
            max_depth=1,
        )
    by_name = {str(h).rstrip("/").rsplit("/", 1)[-1]: str(h) for h in holding}
    match = difflib.get_close_matches(leaf, [n for n in by_name if n != leaf], n=1, cutoff=0.6)
    return by_name[match[0]] if match else None


def _deeper_dirs(root: Path, limit: int, *, max_depth: int = 3, max_dirs: int = 500) -> list[str]:
    found: list[str] = []
    for visited, (current, dirs, files) in enumerate(os.walk(root), start=1):
        depth = len(Path(current).relative_to(root).parts)
        if depth >= max_depth:
            dirs[:] = []
        dirs.sort()
        if depth and any(fingerprint_of_plan_name(f) for f in files):
            found.append(current)
        if len(found) >= limit or visited >= max_dirs:
            break
    return found
