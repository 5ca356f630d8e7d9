"""No crash loop on a plan: a durable note while a plan is being tried, and a hold-back after it.

Why: a node that applies a bad signed plan (too large for what its workload needs at start-up)
dies in its warm-up, restarts, finds the same verified plan, applies it again, and dies again,
for ever. So, beside the plan directory (one node's plans, one node's notes):

- ``plancache-applying-<fp>.json`` is written (atomically, fsynced) *before* a worker applies the
  plan for ``fp``, naming the plan's sha256; it is removed when the boot's start-up ends
  (``compile_or_warm_up_model`` returned). A boot that finds it, for the very plan it is about to
  apply, does not apply it (``unfinished-boot``): it profiles, and at its save compares what it
  profiled with the plan (:func:`plancache.trust.plans.gate.exceeds_profile`).
- ``plancache-held-<fp>.json`` is written when the plan exceeded that fresh profile by more than
  the margin: later boots profile (``plan-exceeds-profile``) until a *different* signed plan for
  ``fp`` arrives (another sha256) or the operator runs ``plancache plan release``.

The notes decide nothing about trust: they only ever turn an "apply" into a "profile". Every
byte read back is hostile: a note that does not parse is treated as present (profile once more:
the safe side), and is never followed through a link (:mod:`plancache.storage.local.files`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ...storage.local.files import read_capped, write_atomic
from ...trust.plans.plan import is_fingerprint

APPLYING = "plancache-applying-{fp}.json"
HELD = "plancache-held-{fp}.json"
MAX_NOTE_BYTES = 4096


def applying_path(directory: Path, fp: str) -> Path:
    return directory / APPLYING.format(fp=fp)


def held_path(directory: Path, fp: str) -> Path:
    return directory / HELD.format(fp=fp)


def _read(path: Path) -> dict[str, Any] | None:
    """The note at ``path``: None if absent; ``{}`` if present but unreadable (still a note)."""
    try:
        data = read_capped(path, MAX_NOTE_BYTES)
    except Exception:
        return {}
    if data is None:
        return None
    try:
        obj = json.loads(data)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def note_applying(directory: Path, fp: str, plan_sha256: str, kv: int) -> Path:
    """Write the note, durably, before the plan is applied. Raises what the write raises: a boot
    that cannot leave the note does not apply the plan (it could loop)."""
    path = applying_path(directory, fp)
    body = {
        "fingerprint": fp,
        "plan_sha256": plan_sha256,
        "kv_cache_memory_bytes": kv,
        "pid": os.getpid(),
        "time": _stamp(),
    }
    write_atomic(path, json.dumps(body, sort_keys=True).encode(), sync_dir=True)
    return path


def unfinished(directory: Path, fp: str, plan_sha256: str) -> dict[str, Any] | None:
    """The note an earlier boot left for this very plan, or None. A note naming other bytes is a
    note for a plan that was since replaced: not this plan's (removed)."""
    note = _read(applying_path(directory, fp))
    if note is None:
        return None
    if note.get("plan_sha256") not in (None, plan_sha256):
        clear(applying_path(directory, fp))
        return None
    return note


def held(directory: Path, fp: str, plan_sha256: str) -> dict[str, Any] | None:
    """The hold-back of this very plan, or None; a hold-back of other bytes is removed (a
    different signed plan for the fingerprint arrived)."""
    note = _read(held_path(directory, fp))
    if note is None:
        return None
    if note.get("plan_sha256") not in (None, plan_sha256):
        clear(held_path(directory, fp))
        return None
    return note


def hold_back(directory: Path, fp: str, plan_sha256: str, plan_kv: int, profiled_kv: int) -> None:
    """Hold this plan back on this node (written durably)."""
    body = {
        "fingerprint": fp,
        "plan_sha256": plan_sha256,
        "kv_cache_memory_bytes": plan_kv,
        "profiled_kv_cache_memory_bytes": profiled_kv,
        "time": _stamp(),
    }
    write_atomic(held_path(directory, fp), json.dumps(body, sort_keys=True).encode())


def clear(path: Path) -> bool:
    """Remove a note; True if one was there."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def held_fingerprints(directory: Path) -> list[str]:
    """Fingerprints this node holds back (``plancache plan release`` lists and clears them)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    prefix, suffix = HELD.split("{fp}")
    found = [
        n[len(prefix) : -len(suffix)] for n in names if n.startswith(prefix) and n.endswith(suffix)
    ]
    return sorted(fp for fp in found if is_fingerprint(fp))
