"""Putting a verified cache directory in place, and clearing what a killed process left in its way.

A pull or a publish extracts a verified archive into a staging directory beside the cache
directory (same filesystem: the rename into place is atomic), checks it against the signed
manifest, and renames it in (:func:`.cachedir.install`). A staging directory is named
``.plancache-<pull|publish>-<the subject's last component>-<random>`` (``mkdtemp``: 0700,
unpredictable). Every pull or publish of a subject holds the node's lock for it while its
staging exists, so whoever holds that lock may remove that subject's leftovers (a process
killed mid-extraction) and only those: another subject's may be in use under another lock.
No leftover blocks anything (no subject is named like one); it only takes room until then.

A sidecar without its cache (a quarantine killed between its two renames, or a directory
removed by hand) proves nothing and blocks everything (a guard cannot verify it, a publish
would keep it): under the lock it is moved aside like any rejected cache, and the flow goes on
as for a missing cache.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from ...trust.compile_cache.manifest import Manifest
from ...trust.errors import Reason, StoreError
from ..local import dirfds
from . import archive_format, cachedir

KINDS = ("pull", "publish")
LONE_SIDECAR = "lone-sidecar"


def staging_prefix(kind: str, directory: Path) -> str:
    """The name every staging directory of ``kind`` for ``directory`` starts with."""
    return f".plancache-{kind}-{directory.name}-"


def sweep_staging(base: Path, directory: Path) -> None:
    """Remove ``directory``'s leftover staging directories (the caller holds its lock). shutil's
    removal relative to the parent's descriptor follows no link; a link so named is left alone."""
    prefixes = tuple(staging_prefix(kind, directory) for kind in KINDS)
    try:
        with dirfds.opened_dir(base, directory.parent, create=False) as parent:
            for name in os.listdir(parent):
                if name.startswith(prefixes):
                    shutil.rmtree(name, dir_fd=parent, ignore_errors=True)
    except (OSError, StoreError):  # no parent yet, or one not to be followed: the install will say
        pass


def install_archive(
    base: Path,
    data: bytes,
    manifest: Manifest,
    directory: Path,
    sig_bytes: bytes,
    quarantine_root: Path,
    check: Callable[[Path], None],
    kind: str,
) -> None:
    """Extract ``data`` (an archive whose sha256 the caller checked against ``manifest``) into a
    fresh staging directory beside ``directory``, ``check`` it (closed world and every sha256),
    then rename it into place with its sidecar; the staging directory goes whatever happens.

    Raises:
        StoreError: the staging directory cannot be made or filled (reason ``local-error``), a
            link on the way, or the install's own (:func:`.cachedir.install`).
        Rejected: the archive is not the manifest's entries
            (:func:`.archive_format.extract_archive`), or ``check``'s verdict.
    """
    try:
        with dirfds.opened_dir(base, directory.parent):
            pass
        sweep_staging(base, directory)
        staged = Path(
            tempfile.mkdtemp(prefix=staging_prefix(kind, directory), dir=directory.parent)
        )
    except OSError as exc:
        raise StoreError(
            f"cannot extract into {directory.parent}: {exc.strerror or exc}",
            reason=Reason.LOCAL_ERROR,
        ) from None
    try:
        archive_format.extract_archive(data, manifest, staged / "x")
        check(staged / "x")
        cachedir.install(
            base, staged / "x", directory, sig_bytes, quarantine_root, reason=f"replaced-by-{kind}"
        )
    except OSError as exc:
        raise StoreError(
            f"cannot extract into {directory.parent}: {exc.strerror or exc}",
            reason=Reason.LOCAL_ERROR,
        ) from None
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def is_lone_sidecar(directory: Path) -> bool:
    """A sidecar (or anything at its name) beside no cache: the directory absent, or holding only
    what vLLM makes itself (:func:`.cachedir.leftovers_only`)."""
    if not os.path.lexists(cachedir.sidecar_path(directory)) or directory.is_symlink():
        return False
    return not os.path.lexists(directory) or cachedir.leftovers_only(directory)


def set_aside_lone_sidecar(base: Path, directory: Path, quarantine_root: Path) -> str:
    """Move a lone sidecar (with the empty directory it stands beside, if any) into the
    quarantine (reason ``lone-sidecar``); what was done, to say in a decision's detail ("" when
    there was none). ``StoreError`` if it cannot be moved: the caller then loads nothing."""
    if not is_lone_sidecar(directory):
        return ""
    moved = cachedir.quarantine(base, directory, quarantine_root, LONE_SIDECAR)
    return f"a signature without its cache moved aside ({moved})"
