"""Which commands read a registry itself, never the mirror a node configures for it.

``verify``, ``ls`` and ``prune --dry-run`` audit: a report about ``oci://registry/…`` that was
read from a mirror would name the registry while it received no request (the mirror may be
stale or serve what the registry no longer holds). They get ``mirror_reads=false`` unless the
operator gives ``mirror_reads`` (``true`` audits through the mirror, named in the output).
``push`` (plans or a compile cache) decides what is already stored, and ``prune`` (without
``--dry-run``) what to delete, and no write or listing for a write may go through a mirror:
they always get ``mirror_reads=false`` (the storage layer's
:func:`~...storage.oci.registry_urls.write_options`, as the plugin's own pushes do). A prune
judged on a mirror's listing deleted the registry's plan set when the mirror's tag list left
out one of its plans (``redteam/poc_prune_sets_via_mirror.py``). ``pull`` and the plugin's
boot read through the mirror: that is what it is for.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

AUDITS = frozenset({"verify", "ls", "prune"})
WRITES = frozenset({"push"})
"""Commands that always read the registry itself; ``prune`` is one unless ``--dry-run``."""


def origin_reads(args: argparse.Namespace, options: Mapping[str, Any]) -> dict[str, Any]:
    """``{"mirror_reads": False}`` for a push or a prune that deletes, or an audit whose
    options do not say ``mirror_reads``, on a registry store URL; nothing otherwise (no other
    store takes it)."""
    from ...storage.oci.registry_urls import write_options

    command = getattr(args, "compile_command", None) or getattr(args, "command", None)
    deletes = command == "prune" and not getattr(args, "dry_run", False)
    if (
        command not in WRITES
        and not deletes
        and (command not in AUDITS or "mirror_reads" in options)
    ):
        return {}
    for name in ("url", "location", "target", "root"):
        place = getattr(args, name, None)
        if isinstance(place, str) and "mirror_reads" in write_options(place, {}):
            return {"mirror_reads": False}
    return {}
