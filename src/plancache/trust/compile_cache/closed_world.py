"""A verified manifest against what lies in the cache directory: the closed world, checked.

Torch uses whatever lies in a cache directory, so a verified manifest is only half the check:
the directory must hold exactly its names, kinds and sizes (:func:`closed_world_difference`,
cheap, before any content is hashed) and exactly its bytes (:func:`digest_difference`). Split
from :mod:`.manifest` by what these share: a listing and digests that a walk found, compared
with a manifest; the walking and hashing are :mod:`plancache.storage.compile_cache.cachedir`'s.
Pure, no IO.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..display import safe_text
from .manifest import Manifest

Listing = Mapping[str, int | None]
"""What a walk found: relative path -> size for a regular file, None for a directory."""


def closed_world_difference(manifest: Manifest, listing: Listing) -> str:
    """How a directory's names, kinds and sizes differ from the manifest ("" if they do not).
    Checked before any content is hashed: the cheap, structural half of the closed world."""
    wanted: dict[str, int | None] = {f.path: f.size for f in manifest.files}
    wanted.update(dict.fromkeys(manifest.dirs))
    extra = sorted(set(listing) - set(wanted))
    if extra:
        return f"'{safe_text(extra[0], 160)}' is not in the signed manifest" + (
            f" (+{len(extra) - 1} more)" if len(extra) > 1 else ""
        )
    missing = sorted(set(wanted) - set(listing))
    if missing:
        return f"'{safe_text(missing[0], 160)}' is missing" + (
            f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""
        )
    for path, size in listing.items():
        if size != wanted[path]:
            found = "a directory" if size is None else f"{size} bytes"
            signed = "a directory" if wanted[path] is None else f"{wanted[path]} bytes"
            return f"'{safe_text(path, 160)}' is {found}, signed as {signed}"
    return ""


def digest_difference(manifest: Manifest, digests: Mapping[str, str]) -> str:
    """The first file whose sha256 differs from the signed one ("" if none)."""
    for entry in manifest.files:
        if digests.get(entry.path) != entry.sha256:
            return f"'{safe_text(entry.path, 160)}' does not match its signed sha256 (altered?)"
    return ""
