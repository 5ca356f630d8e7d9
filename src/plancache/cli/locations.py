"""Where plans are: a local directory (vLLM's plan directory by default) or a store URL.

Both kinds answer the same two questions -- which fingerprints are there, and what are the
bytes of each plan and sidecar -- so ``verify``, ``ls`` and ``prune`` do not care which.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

from ..settings import STORAGE_OPTIONS_ENV, parse_storage_options

from ..storage.items import Item
from ..storage.localdir import LocalPlanDir, default_plan_dir
from ..trust.errors import PlanCacheError, Reason
from .args import key_value

BULK_TIMEOUT = 120.0
"""Budget of each store operation for whole-store commands (verify, ls, push, prune, full pull)."""


class PlanSource(Protocol):
    def fingerprints(self) -> list[str]: ...

    def fetch_items(self, fingerprints: Sequence[str]) -> list[Item]: ...


class DirSource:
    def __init__(self, directory: LocalPlanDir) -> None:
        self.dir = directory

    def __str__(self) -> str:
        return str(self.dir)

    def fingerprints(self) -> list[str]:
        return self.dir.fingerprints()

    def fetch_items(self, fingerprints: Sequence[str]) -> list[Item]:
        items: list[Item] = []
        for fp in fingerprints:
            try:
                items.append((fp, *self.dir.read(fp)))
            except PlanCacheError as exc:
                items.append((fp, exc, None))
        return items


def is_url(location: str | None) -> bool:
    return bool(location) and "://" in str(location)


def local_dir(location: str | None, must_exist: bool = True) -> LocalPlanDir:
    path = Path(location).expanduser() if location else default_plan_dir()
    if must_exist and not path.is_dir():
        raise ConfigError(f"plan directory {path} does not exist")
    return LocalPlanDir(path)


def add_store_options(parser: argparse.ArgumentParser, timeout_help: str = "") -> None:
    """``--storage-option`` and ``--timeout``: shared by every command that takes a URL."""
    parser.add_argument(
        "--storage-option", type=key_value, action="append", metavar="KEY=VALUE",
        help="fsspec storage option, VALUE parsed as JSON where it parses, e.g. "
        f"endpoint_url=http://127.0.0.1:9000 or anon=true (repeatable; wins over ${STORAGE_OPTIONS_ENV} "
        "and plancache's defaults)",
    )
    parser.add_argument(
        "--timeout", type=float, metavar="SECONDS",
        help=timeout_help or f"overall budget of each store operation (default {BULK_TIMEOUT:g} s)",
    )


def storage_options(args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """``$PLANCACHE_STORAGE_OPTIONS`` overridden by ``--storage-option`` flags."""
    options: dict[str, Any] = {}
    raw = env.get(STORAGE_OPTIONS_ENV, "").strip()
    if raw:
        try:
            options = parse_storage_options(raw)
        except ValueError as exc:
            raise ConfigError(f"{STORAGE_OPTIONS_ENV}: {exc}") from None
    options.update(getattr(args, "storage_option", None) or [])
    return options


def open_source(
    location: str | None, storage_options: Mapping[str, Any] | None = None, timeout: float | None = None
) -> PlanSource:
    """A directory, or for a URL the store itself (a :class:`~plancache.storage.store.Store`
    answers the same two questions; fsspec is imported only on this path)."""
    if is_url(location):
        from ..storage.store import open_store

        return open_store(str(location), storage_options, BULK_TIMEOUT if timeout is None else timeout)
    return DirSource(local_dir(location))
