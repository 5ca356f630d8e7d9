"""Which commands read a registry itself, never the mirror a node configures for it.

``verify``, ``ls`` and ``prune`` audit: a report about ``oci://registry/…`` that was read from a
mirror would name the registry while it received no request (the mirror may be stale or serve
what the registry no longer holds). ``push`` decides what is already stored, and no write or
listing for a write may go through a mirror. They get ``mirror_reads=false`` unless the
operator gives ``mirror_reads`` (``true`` audits through the mirror, named in the output).
``pull`` and the plugin's boot read through the mirror: that is what it is for.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

ORIGIN_COMMANDS = frozenset({"verify", "ls", "prune", "push"})


def origin_reads(args: argparse.Namespace, options: Mapping[str, Any]) -> dict[str, Any]:
    """``{"mirror_reads": False}`` for an ORIGIN_COMMANDS command on a registry store URL whose
    options do not say ``mirror_reads``; nothing otherwise (no other store takes the option)."""
    from ...storage.oci.registry_urls import is_registry_url

    command = getattr(args, "compile_command", None) or getattr(args, "command", None)
    if command not in ORIGIN_COMMANDS or "mirror_reads" in options:
        return {}
    places = (getattr(args, name, None) for name in ("url", "location", "target", "root"))
    if any(isinstance(p, str) and is_registry_url(p) for p in places):
        return {"mirror_reads": False}
    return {}
