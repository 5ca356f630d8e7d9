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
names plancache writes; a tag of anything else is skipped. A registry pages ``tags/list`` as it
likes (``Link: rel="next"``, forever if it is hostile; some ignore ``?n`` and send every tag at
once, one capped answer), so at most :data:`..listing.MAX_NAMES` names are kept, the cap every
store's listing has: the page that passes it is the last one read. Memory is then bounded by the
cap and one page (:data:`.registry_answers.TAGS_CAP`), whatever the registry says follows; the
deadline bounds the time. With a ``subject`` the names are the image's referrers
(:mod:`.referrers`: one index, itself capped at :data:`.oci_manifests.MAX_REFERRERS` entries).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ...trust.errors import Reason, Rejected
from .. import listing
from ..listing import Page, entry_info
from ..versioned import Versioned
from . import referrers
from .artifacts import names_of_tag
from .registry_urls import TAG

if TYPE_CHECKING:
    from .registry_fs import RegistryFileSystem


FOREIGN = "foreign"
"""The version of what a tag names when it is not a manifest of the object's kind."""


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
    from .artifacts import slot_of

    slot = slot_of(fs.name_of(path))
    try:
        manifest = await fs.deletable_manifest(slot)
    except Rejected as exc:
        if exc.reason is not Reason.MALFORMED:
            raise
        # another kind's manifest (a co-tenant's image, say) at the object's tag: never the
        # object judged, so never deleted as it (the same digest is the image's), and one such
        # tag must not fail the whole prune: it reads as changed, and is kept
        return Versioned(b"", FOREIGN)
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
        names: list[Any] = await all_names(fs)
        following = None
    else:
        names, following = await tag_names(fs, start=token, pages=1)
    entries = [info for info in (entry_info(n, None, {}) for n in names) if info is not None]
    return Page(entries, following)


TAGS_PAGE = 1000
MAX_TAG_PAGES = 1000


async def tag_names(
    fs: RegistryFileSystem,
    *,
    start: str | None = None,
    pages: int = MAX_TAG_PAGES,
    keep: int | None = None,
) -> tuple[list[str], str | None]:
    """Object names of ``tags/list`` pages from ``start``, and where the next page starts
    (None at the end). At most ``keep`` names are kept: the page that would pass it is the
    last one read, and its names past ``keep`` are dropped (the caller sees ``keep + 1``
    names and decides), so memory is bounded by ``keep`` and one capped page, never by how
    many pages the registry says follow.

    Raises:
        Rejected: a page that is not JSON (reason ``malformed``).
    """
    keep = listing.MAX_NAMES if keep is None else keep
    last = start
    names: list[str] = []
    for _ in range(pages):
        body, more = await fs.tag_reader.tags_page(last, TAGS_PAGE)
        tags = [t for t in tags_of(body) if isinstance(t, str) and TAG.fullmatch(t)]
        del body
        for tag in tags:
            names += names_of_tag(tag)
            if len(names) > keep:
                return names[: keep + 1], tag
        if not more or not tags or tags[-1] == last:
            return names, None
        last = tags[-1]
    return names, last


def tags_of(body: bytes) -> list[Any]:
    """The ``tags`` of a ``tags/list`` answer (none when null or missing, as distribution
    answers for an empty repository).

    Raises:
        Rejected: not a JSON object, or ``tags`` not a list (reason ``malformed``): read as an
            empty repository, a broken answer would pass for one.
    """
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        doc = None
    tags = doc.get("tags") if isinstance(doc, dict) else ()
    if tags is None:
        return []
    if not isinstance(tags, list):
        raise Rejected(Reason.MALFORMED, "the registry's tag list is not a JSON list of tags")
    return tags


async def all_names(fs: RegistryFileSystem) -> list[str]:
    """Every object name: the subject's attached ones, else the whole tag list (at most
    :data:`..listing.MAX_NAMES` names, in at most MAX_TAG_PAGES pages).

    Raises:
        Rejected: the tag list names more than MAX_NAMES objects or runs past
            MAX_TAG_PAGES pages (reason ``too-large``).
    """
    if fs.subject_text is not None:
        return await referrers.attached_names(fs)
    names, more = await tag_names(fs)
    if len(names) > listing.MAX_NAMES:
        raise Rejected(
            Reason.TOO_LARGE,
            f"the tag list of {fs.repository} names more than {listing.MAX_NAMES} objects",
        )
    if more is not None:
        raise Rejected(
            Reason.TOO_LARGE,
            f"the tag list of {fs.repository} runs past {MAX_TAG_PAGES} pages",
        )
    return names
