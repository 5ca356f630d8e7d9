"""Where plans are: a local directory (vLLM's plan directory by default) or a store URL.

Both answer the same two questions -- which fingerprints are there, and what are the raw
bytes of each plan and sidecar (``fetch_many``, as :class:`~plancache.trust.result.PlanResult`)
-- so auditing, listing and pruning do not care which. fsspec is imported only for a URL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Union

from ..storage.localdir import LocalPlanDir, default_plan_dir
from ..storage.store import Store, open_store
from ..trust.errors import ConfigError

BULK_TIMEOUT = 120.0
"""Budget of each store operation for whole-store commands (verify, ls, push, prune, full pull)."""

Location = Union[LocalPlanDir, Store]


def is_url(location: str | None) -> bool:
    return bool(location) and "://" in str(location)


def require_url(url: str) -> str:
    if not is_url(url):
        raise ConfigError(f"not a store URL: {url!r} (expected e.g. s3://bucket/prefix)")
    return url


def local_dir(location: str | Path | None, must_exist: bool = True) -> LocalPlanDir:
    """A plan directory (default: vLLM's, resolved as vLLM resolves it)."""
    path = Path(location).expanduser() if location else default_plan_dir()
    if must_exist and not path.is_dir():
        raise ConfigError(f"plan directory {path} does not exist")
    return LocalPlanDir(path)


def open_location(
    location: str | Path | None, storage_options: Mapping[str, Any] | None = None, timeout: float | None = None
) -> Location:
    """A directory, or for a URL the store itself (the same ``fingerprints``/``fetch_many``)."""
    if is_url(str(location) if location else None):
        return open_store(str(location), storage_options, BULK_TIMEOUT if timeout is None else timeout)
    return local_dir(location)
