"""What a signature of a compile cache covers: the manifest and archive built from a directory,
and vLLM's cache-key factors as signed (keyed under a fresh salt, credentials masked).

Apart from the flows (:mod:`.flows`) because signing in place and publishing a build node's
private copy both build their manifest here, and the plugin reads vLLM's factors file the same
way (:func:`factors_of`) for its boot records, without the flows' store and lock machinery.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from ...storage.compile_cache import archive_format, cachedir
from ...storage.local.files import read_capped
from ...trust import strictjson
from ...trust.compile_cache.manifest import FileEntry, Manifest
from ...trust.errors import PlanCacheError
from ...trust.inputs import check_inputs, keyed_factors, new_salt, without_secrets

FACTORS_FILE = "cache_key_factors.json"
MAX_FACTORS_BYTES = 256 * 1024


def factors_of(data: bytes | None) -> dict[str, Any] | None:
    """vLLM's ``cache_key_factors.json`` as this node compares it (strict JSON, bounded, credentials
    masked: :func:`~plancache.trust.inputs.without_secrets`), or None when it is absent or not
    such an object (the manifest then records none). Never signed as is: :func:`build_manifest`
    keys every value but an allow-list of compile settings first."""
    if data is None:
        return None
    try:
        return without_secrets(check_inputs(strictjson.loads(data, FACTORS_FILE), FACTORS_FILE))
    except PlanCacheError:
        return None


def key_factors_in(directory: Path, listing: Mapping[str, int | None]) -> dict[str, Any] | None:
    """The factors vLLM wrote into a ``<10 hex>`` directory (``rank_<r>_<dp>/<prefix>/``; the
    first in name order). An AOT directory holds none: the caller passes what the boot saw."""
    for path in sorted(
        p
        for p, size in listing.items()
        if size is not None and p.rpartition("/")[2] == FACTORS_FILE
    ):
        try:
            found = factors_of(read_capped(directory / path, MAX_FACTORS_BYTES))
        except PlanCacheError:  # too large, unreadable: the manifest records no factors
            continue
        if found is not None:
            return found
    return None


def build_manifest(
    directory: Path,
    subject: str,
    now: datetime,
    expires_at: datetime | None,
    comment: str,
    *,
    key_factors: Mapping[str, Any] | None = None,
    measurements: Mapping[str, Any] | None = None,
) -> tuple[Manifest, bytes]:
    """The manifest of a directory as it is now (a build node's private copy, or one signed in
    place), and its deterministic archive; with vLLM's cache-key factors (given, else found
    inside) and the build's measurements, when known. vLLM's debug files are neither listed nor
    archived (its ``cache_key_factors.json`` holds the node's environment in the clear; vLLM never
    reads them: :func:`check_names`); the factors are signed keyed under a fresh salt
    (:func:`~plancache.trust.inputs.keyed_factors`), or left out if they would not fit."""
    listing = cachedir.walk(directory)
    dirs = tuple(sorted(p for p, size in listing.items() if size is None))
    kept = {
        p: size
        for p, size in listing.items()
        if size is not None and p.rpartition("/")[2] not in cachedir.DEBUG_FILES
    }
    sums = cachedir.digests(directory, kept)
    files = tuple(FileEntry(p, size, sums[p]) for p, size in sorted(kept.items()))
    data = archive_format.archive_bytes(directory, files, dirs)
    found = dict(key_factors) if key_factors is not None else key_factors_in(directory, listing)
    try:
        factors = (
            None if found is None else check_inputs(keyed_factors(found, new_salt()), "key factors")
        )
    except PlanCacheError:
        factors = None
    manifest = Manifest(
        subject,
        files,
        dirs,
        hashlib.sha256(data).hexdigest(),
        len(data),
        now,
        expires_at,
        comment,
        factors,
        dict(measurements) if measurements else None,
    )
    return manifest, data
