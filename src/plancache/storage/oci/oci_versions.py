"""A registry's versions, for ``prune`` (:mod:`..conditional_deletes`) and its listing pages.

An object's version on a registry is its manifest's digest: the re-read states it (the
manifest read from the registry itself, never a mirror), and the delete is by that digest, so
a manifest replaced since the re-read is another digest and is never the one deleted. The tag
is looked up once more right before the delete: if it has moved, the delete is refused as a
412 (the same ``changed`` answer S3, GCS and Azure give), and the replaced manifest is left to
the writer that replaced it. A tag that names another object's manifest (titled otherwise: a
co-tenant's alias) is read here as it is, so it never compares equal to what was judged (the
judging read refused it: ``name-mismatch``), and its delete is refused the same way:
distribution would drop every tag on that digest, the other object's own too. With a
``subject``, the re-read and the delete take the same attached candidate as the judging read
(:func:`.referrers.candidate_manifest`), so ``prune --subject`` deletes the one that failed.

The listing page is one ``tags/list`` page (the token is the last tag seen), mapped to the
names plancache writes; a tag of anything else is skipped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..listing import Page, entry_info
from ..versioned import Versioned

if TYPE_CHECKING:
    from .registry_fs import RegistryFileSystem


class Moved(Exception):
    """The tag no longer names the manifest judged: the conditional delete's 412."""

    status = 412


async def read(fs: RegistryFileSystem, path: str, cap: int) -> Versioned:
    """The object's bytes (at most ``cap``) and its manifest's digest, from the registry.

    Raises:
        FileNotFoundError: no manifest at the object's tag, or none of the object's kind in it.
        Rejected: the object is larger than ``cap`` (reason ``too-large``), or the registry's
            answers fail their checks (:meth:`.registry_http.RegistryClient.blob`).
    """
    from ...trust.errors import Reason, Rejected
    from .artifacts import slot_of

    slot = slot_of(fs.name_of(path))
    manifest = await fs.deletable_manifest(slot)
    layer = manifest.layer(slot.media_type) if manifest is not None else None
    if manifest is None or layer is None:
        raise FileNotFoundError(path)
    if layer.size > cap:
        raise Rejected(
            Reason.TOO_LARGE, f"{slot.artifact} in the registry is larger than {cap} bytes"
        )
    data = (
        layer.data
        if layer.data is not None
        else await fs.origin.blob(layer.digest, layer.size, cap)
    )
    return Versioned(data, manifest.digest)


async def delete(fs: RegistryFileSystem, path: str, token: str) -> None:
    """Delete the object if its tag still names manifest ``token``; :class:`Moved` otherwise."""
    await fs._rm_file(path, expected=token)


async def oci_page(fs: RegistryFileSystem, token: str | None) -> Page:
    """One listing page of the store's plan, sidecar and set names."""
    if fs.subject_text is not None:
        names: list[Any] = await fs.all_names()
        following = None
    else:
        names, following = await fs.tag_names(start=token, pages=1)
    entries = [info for info in (entry_info(n, None, {}) for n in names) if info is not None]
    return Page(entries, following)
