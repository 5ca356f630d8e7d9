"""A node process for tests/test_compile_install_atomic.py: pull a cache (and die at a chosen
step), or run the guard, as whichever user started it; one ``RESULT {json}`` line.

    install_steps.py pull ROOT STORE_DIR PUBLIC_KEY [KILL_AT]
    install_steps.py guard ROOT STORE_DIR PUBLIC_KEY [fetch [MINUTES]]

(the guard's clock: ``MINUTES`` after the tests' ``NOW``)

``KILL_AT`` N: the process sends itself SIGKILL just before its N-th filesystem step (a
``rename``, ``link``, ``unlink``, ``mkdir``, ``rmdir`` or ``fsync``), as a kill from outside
would land between two system calls; the result then never prints. Without it, the pull runs
whole and says how many steps it took.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from conftest import NOW
from plancache.clock import Deadline
from plancache.keys.keyfile import load_keyring
from plancache.pipeline.compile_cache import flows as cc
from plancache.pipeline.compile_cache import load as cl
from plancache.pipeline.compile_cache.local_caches import CacheRoot
from plancache.storage.compile_cache import cachedir
from plancache.storage.store import open_store
from plancache.trust.errors import PlanCacheError

SUBJECT = "torch_aot_compile/" + "a7" * 32
STEPS = ("rename", "link", "unlink", "mkdir", "rmdir", "fsync")
taken = [0]
"""Filesystem steps taken so far (a list: changed from the wrappers)."""


def kill_at(step: int) -> None:
    """Die just before the ``step``-th filesystem step."""

    def counted(original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            taken[0] += 1
            if taken[0] == step:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(*args, **kwargs)

        return call

    for name in STEPS:
        setattr(os, name, counted(getattr(os, name)))


def main(argv: list[str]) -> dict[str, Any]:
    command, root, store_dir, key = argv[:4]  # key: the trusted public key
    cache_root = CacheRoot(Path(root))
    keyring = load_keyring(Path(key))
    store = open_store(f"file://{store_dir}")
    if command == "pull":
        if len(argv) > 4:
            kill_at(int(argv[4]))
        else:
            kill_at(0)  # counted, never killed
        try:
            outcome = cc.pull_cache(store, cache_root, SUBJECT, keyring, NOW, wait=5)
            return {"action": outcome.action, "reason": "", "steps": taken[0]}
        except PlanCacheError as exc:
            return {"action": "error", "reason": exc.reason.value, "detail": exc.detail}
    into = Path(tempfile.mkdtemp(prefix="install-steps-")) / "into"  # off the tmpfs under test
    fetch = (lambda: (store, Deadline.after(30))) if argv[4:5] == ["fetch"] else None
    now = NOW + timedelta(minutes=float(argv[5])) if len(argv) > 5 else NOW
    outcome = cl.guard(cache_root, SUBJECT, keyring, now, into, fetch=fetch, wait=5)
    shutil.rmtree(into.parent, ignore_errors=True)
    return {
        "action": outcome.action,
        "reason": outcome.reason,
        "detail": outcome.detail,
        "archive_sha256": outcome.archive_sha256,
        "quarantine": quarantined(cache_root),
        "sidecar": cachedir.sidecar_path(cache_root.directory(SUBJECT)).exists(),
    }


def quarantined(cache_root: CacheRoot) -> list[str]:
    """This user's quarantine entries: the root's, and the fallback's beside the cache (where
    they go when another user made the root's first)."""
    found: list[str] = []
    beside = cache_root.directory(SUBJECT).parent / cachedir.QUARANTINE_SUBDIR
    for place in (cache_root.quarantine_root, beside):
        if place.is_dir() and place.stat().st_uid == os.geteuid():
            found += os.listdir(place)
    return sorted(found)


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1:])), flush=True)
