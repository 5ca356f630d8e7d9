"""Where a node keeps what it remembers about a plan directory it cannot write.

The plugin's boot notes (``plancache-applying-<fp>.json``, ``plancache-held-<fp>.json``) live
beside the plans when it can write there. Plans baked into a read-only image layer, or shipped as
a read-only ConfigMap or volume mount at vLLM's plan directory, leave no room there; the notes then
go to a durable, node-local directory of this user's, one per plan directory:

    ``$PLANCACHE_STATE_DIR`` (else ``$VLLM_CACHE_ROOT``) ``/plancache-state/plans-<16 hex>/``

where the hex is the sha256 of the plan directory's real path, so the plugin and ``plancache
release`` (same environment, ``--dir`` spelled any way) find the same place, and two plan
directories never share notes. ``plancache-state`` and each ``plans-*`` directory are made mode
0700, reached from the base without following a link, and must be this user's and closed to
group and world writes (:func:`~plancache.storage.local.dirfds.require_owned`): a directory
someone else can write could be filled with notes that hold a good plan back, or emptied to
take away crash-loop protection. Decides nothing: a place that is not safe is an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from ...trust.errors import StoreError
from .dirfds import DIR_FLAGS, open_dir, require_owned
from .localdir import vllm_cache_root

STATE_DIR_ENV = "PLANCACHE_STATE_DIR"
STATE_SUBDIR = "plancache-state"


def state_base(env: Mapping[str, str] = os.environ) -> Path:
    """``$PLANCACHE_STATE_DIR``, else vLLM's cache root (the operator's, followed as given)."""
    given = env.get(STATE_DIR_ENV)
    return Path(os.path.expanduser(given)) if given else vllm_cache_root(env)


def state_dir_for(plan_directory: Path, env: Mapping[str, str] = os.environ) -> Path:
    """The fallback notes directory of ``plan_directory`` (its real path's sha256, 16 hex)."""
    real = os.path.realpath(plan_directory)
    key = hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return state_base(env) / STATE_SUBDIR / f"plans-{key}"


def open_state_dir(
    plan_directory: Path, *, create: bool, env: Mapping[str, str] = os.environ
) -> int:
    """A descriptor of :func:`state_dir_for`'s directory (the caller closes it), made (0700)
    when ``create``.

    Raises:
        StoreError: a component is a link or not a directory, or ``plancache-state`` or the
            notes directory is another user's or open to others' writes (``unsafe-directory``);
            the base cannot be made or opened (``store-error``).
        FileNotFoundError: the directory is absent and not ``create``.
    """
    base = state_base(env)
    try:  # absent on most nodes: found before the plan directory's real path is resolved
        top = open_dir(base, base / STATE_SUBDIR, create=create, mode=0o700)
    except (FileNotFoundError, StoreError):
        raise
    except OSError as exc:
        raise StoreError(f"cannot open {base}: {exc.strerror or exc}") from None
    target = state_dir_for(plan_directory, env)
    try:
        require_owned(top, target.parent)
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(target.name, 0o700, dir_fd=top)
        fd = os.open(target.name, DIR_FLAGS, dir_fd=top)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise StoreError(f"cannot open {target}: {exc.strerror or exc}; not followed") from None
    finally:
        os.close(top)
    try:
        require_owned(fd, target)
    except BaseException:
        os.close(fd)
        raise
    return fd
