"""Keeping the checkout reachable in a mount namespace that mounts over the temporary directories.

The real-node tests mount fresh tmpfs (or ``noexec`` binds) over ``/tmp``, ``/var/tmp`` and
``/dev/shm`` in a mount namespace of their own. A checkout (and its venv) that itself lies under
one of them (a CI clone in ``/tmp``) would vanish, or lose exec, inside it: torch's libraries then
fail to load and the test measures nothing. :func:`keep_reachable` gives the shell to run before
and after those mounts so that such paths are bound back as they were; elsewhere it is empty.
The same tests run the interpreter as other uids: :func:`interpreter_reachable`.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _under(path: Path, parents: Iterable[str]) -> bool:
    return any(path == Path(p) or Path(p) in path.parents for p in parents)


def keep_reachable(parents: Iterable[str]) -> tuple[str, str]:
    """(before, after): shell fragments (each ending in ``|| exit 1;`` when not empty) that
    stash the checkout and the interpreter's prefix lying under ``parents`` in bind mounts
    outside them, then bind them back at their own paths once the parents are mounted over."""
    parents = [str(Path(p).resolve()) for p in parents]
    keep = sorted(
        {str(p) for p in (ROOT, Path(sys.prefix).resolve()) if _under(p, parents)},
        key=len,
    )
    keep = [p for p in keep if not any(Path(k) in Path(p).parents for k in keep)]
    if not keep:
        return "", ""
    stash = Path(tempfile.mkdtemp(prefix="plancache-keep-", dir="/srv"))
    before, after = [], []
    for i, path in enumerate(keep):
        (stash / str(i)).mkdir()
        before.append(f"mount --bind {path} {stash / str(i)}")
        after.append(f"mkdir -p {path} && mount --bind {stash / str(i)} {path}")
    return " && ".join(before) + " || exit 1; ", " && ".join(after) + " || exit 1; "


def interpreter_reachable() -> None:
    """Let other users run this interpreter: the venv's python links into root's pyenv, under a
    ``/root`` of mode 0700 here; each directory on the way gets search (x) for others, no read."""
    for path in {
        Path(os.path.realpath(sys.executable)),
        Path(os.path.realpath(sys.base_prefix)) / "lib",
    }:
        for parent in path.parents:
            mode = parent.stat().st_mode
            if not mode & 0o001:
                parent.chmod(mode | 0o001)
