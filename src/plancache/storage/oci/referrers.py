"""Artifacts attached to an image (OCI 1.1 ``subject``): pushed, listed, read and forgotten.

``push --subject IMAGE`` (the storage option ``subject``) writes every manifest with the
image's descriptor as its ``subject``. A registry with the referrers API indexes it itself
and says so (``OCI-Subject`` in the PUT's answer); one without (distribution 2.8, Debian's
``docker-registry``) gets the referrers tag schema: an image index at the tag
``sha256-<hex of the image digest>`` that plancache keeps, adding the new manifest and
dropping the one it replaced. A registry with the API gets that index too, though OCI 1.1's
distribution-spec asks for it only where ``OCI-Subject`` is missing: a node reading through
a pull-through mirror finds no referrers API there (distribution's proxy has no such route: a
404) and, as the spec tells clients on a 404, falls back to the tag schema, which the mirror
does serve; and tools that copy a repository's tags (``skopeo sync``) carry the index to
registries without the API. Deleting a manifest drops it from that index first, so the
index never points at what was deleted (wherever it exists, whatever the registry said).
The index is updated read-modify-write: distribution 2.8 ignores ``If-Match`` on a manifest
PUT, so two writers attaching to one image at the same instant can lose an entry (in one
process a lock orders them).

Reads and listings with a subject go through the image's referrers (the API, else the tag
schema's index): only what is attached to that image is listed, and each object is read by
the digest its referrer names, not by tag.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...trust.errors import Rejected, StoreError
from .artifacts import ARTIFACT_TYPES, DSSE_TYPE, INDEX_TYPE, Slot, names_of_tag
from .oci_manifests import Descriptor, Manifest, build_index, is_own, parse_index
from .registry_answers import MAX_MANIFEST, expect, media_type_of, read_capped, sha256_digest
from .registry_urls import parse_image_reference

if TYPE_CHECKING:
    from .registry import RegistryBackend
    from .registry_http import RegistryClient

IMAGE_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)


@dataclass
class SubjectState:
    """What one store learned about its subject: resolved once, attached objects once."""

    lock: asyncio.Lock | None = None
    descriptor: Descriptor | None = None
    attached: dict[str, list[str]] | None = None
    index_lock: asyncio.Lock | None = None
    notes: list[str] = field(default_factory=list)


def _lock(state: SubjectState, attr: str) -> asyncio.Lock:
    lock = getattr(state, attr)
    if lock is None:
        lock = asyncio.Lock()
        setattr(state, attr, lock)
    return lock


async def subject_descriptor(fs: RegistryBackend) -> Descriptor | None:
    """The subject image's descriptor, its tag resolved to a digest once (None without one).

    Raises:
        StoreError: the image is not in the repository.
    """
    if fs.subject is None:
        return None
    state = fs.subject_state
    async with _lock(state, "lock"):
        if state.descriptor is None:
            ref = parse_image_reference(fs.subject, fs.origin.registry, fs.repository)
            got = await _image_manifest(fs, ref.digest or ref.tag or "")
            if got is None:
                raise StoreError(f"--subject {ref}: no such image in {fs.repository}")
            state.descriptor = got
        return state.descriptor


async def _image_manifest(fs: RegistryBackend, reference: str) -> Descriptor | None:
    client = fs.reader if reference.startswith("sha256:") else fs.tag_reader
    response = await client.send(
        "GET",
        f"/v2/{fs.repository}/manifests/{reference}",
        headers={"Accept": ", ".join(IMAGE_TYPES)},
    )
    async with response:
        if response.status == 404:
            return None
        await expect(response, (200,), f"image {reference}")
        media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
        body = await read_capped(response, MAX_MANIFEST, f"image {reference}")
    digest = sha256_digest(body)
    if media_type not in IMAGE_TYPES or (reference.startswith("sha256:") and digest != reference):
        raise StoreError(
            f"--subject: {reference} is not an image manifest the registry vouches for"
        )
    return Descriptor(media_type, digest, len(body))


def fallback_tag(digest: str) -> str:
    return "sha256-" + digest.split(":", 1)[1]


async def _index(fs: RegistryBackend, subject_digest: str, origin: bool) -> list[Descriptor] | None:
    tag = fallback_tag(subject_digest)
    if origin:
        got = await fs.origin.manifest(tag, (INDEX_TYPE,))
    else:
        got = await fs.read_manifest(tag, (INDEX_TYPE,))
    return None if got is None else parse_index(got[0], "the referrers index")


async def _rewrite(
    fs: RegistryBackend, subject_digest: str, drop: set[str], add: Descriptor | None
) -> None:
    async with _lock(fs.subject_state, "index_lock"):
        entries = await _index(fs, subject_digest, origin=True)
        if entries is None and add is None:
            return
        kept = [
            e
            for e in entries or []
            if e.digest not in drop and (add is None or e.digest != add.digest)
        ]
        if add is not None:
            kept.append(add)
        if entries is not None and [e.digest for e in kept] == [e.digest for e in entries]:
            return
        await fs.origin.put_manifest(fallback_tag(subject_digest), build_index(kept), INDEX_TYPE)


async def after_put(
    fs: RegistryBackend, subject: Descriptor | None, new: Descriptor, replaced: Manifest | None
) -> None:
    """Index a manifest just put with ``subject`` in the tag schema, also where the registry's
    own referrers API took it (``OCI-Subject``: see the module docstring); the manifest it
    replaced for the same image leaves the index (one attached to another image stays attached
    to that one)."""
    fs.subject_state.attached = None
    if subject is None:
        return
    old = {replaced.digest} if same_subject(replaced, subject) and replaced is not None else set()
    await _rewrite(fs, subject.digest, old, new)


def same_subject(manifest: Manifest | None, subject: Descriptor | None) -> bool:
    """Whether ``manifest`` is attached to ``subject`` (both to none counts)."""
    if manifest is None:
        return False
    mine = manifest.subject.digest if manifest.subject is not None else None
    return mine == (subject.digest if subject is not None else None)


async def forget(fs: RegistryBackend, manifest: Manifest) -> None:
    """Drop ``manifest`` from its subject's tag-schema index, before it is deleted."""
    fs.subject_state.attached = None
    if manifest.subject is not None:
        await _rewrite(fs, manifest.subject.digest, {manifest.digest}, None)


async def _api_index(fs: RegistryBackend, digest: str) -> bytes | None:
    """The referrers API's index for ``digest`` (from the content reader: a digest's question);
    None where there is no such API (distribution 2.8, and its proxy: a 404)."""
    client = fs.reader
    response = await client.send(
        "GET", f"/v2/{client.repository}/referrers/{digest}", headers={"Accept": INDEX_TYPE}
    )
    async with response:
        if response.status in (404, 405, 400) or media_type_of(response.headers) != INDEX_TYPE:
            return None
        await expect(response, (200,), "the referrers of the image")
        return await read_capped(response, MAX_MANIFEST, "the referrers index")


MAX_CANDIDATES = 8
"""Manifests attached with one object's title that a reader tries, newest first: one that
fails its checks (another kind, another title, no content, or, for a signed kind, no
signature) does not hide the next; ``prune --subject`` deletes one that fails verification."""


async def _attached(fs: RegistryBackend) -> dict[str, list[str]]:
    """Name -> digests of the plancache manifests attached to the subject with that title,
    newest first (the index's later entries: the tag schema appends), at most MAX_CANDIDATES
    each; a signature's name when an entry says signed."""
    state = fs.subject_state
    subject = await subject_descriptor(fs)
    assert subject is not None
    async with _lock(state, "index_lock"):
        if state.attached is None:
            body = await _api_index(fs, subject.digest)
            entries = (
                parse_index(body, "the referrers of the image")
                if body is not None
                else await _index(fs, subject.digest, origin=False) or []
            )
            attached: dict[str, list[str]] = {}
            for entry in reversed(entries):
                title = entry.title or ""
                if entry.artifact_type not in ARTIFACT_TYPES or not names_of_tag(
                    title.replace("/", "--")
                ):
                    continue
                for name in (title, title + ".sig") if entry.signed else (title,):
                    found = attached.setdefault(name, [])
                    if len(found) < MAX_CANDIDATES and entry.digest not in found:
                        found.append(entry.digest)
            state.attached = attached
        return state.attached


async def candidate_manifests(
    fs: RegistryBackend,
    slot: Slot,
    *,
    client: RegistryClient | None = None,
    first: bool = False,
) -> list[Manifest]:
    """The manifests attached to the subject that are the slot's object's own (its kind, its
    title, attached to this image) and hold its content, newest first; for a kind that is
    signed, those holding a signature too come first (a plan and its signature are read from
    one manifest). At most MAX_CANDIDATES manifests are read; one that fails its checks is
    skipped, so an unsigned or malformed referrer titled like a plan does not hide the signed
    one. A manifest whose own ``subject`` is another image is skipped too: the tag-schema
    index is a tag anyone who may push can rewrite, and a co-tenant who lists image Y's plan
    there would have it read as X's, and ``prune --subject X`` delete it from Y.
    ``client`` reads from there (the registry itself, for ``prune``'s re-read); ``first``:
    stop at the first that holds all it should (one read in the ordinary case)."""
    subject = await subject_descriptor(fs)
    names = await _attached(fs)
    signed: list[Manifest] = []
    unsigned: list[Manifest] = []
    for digest in names.get(slot.artifact, [])[:MAX_CANDIDATES]:
        if signed and first:
            break
        try:
            manifest = await fs.tagged_manifest(slot, client, digest)
        except Rejected:
            continue
        if manifest is None or not is_own(manifest, slot) or not same_subject(manifest, subject):
            continue
        if manifest.layer(slot.kind.content_type) is None:
            continue
        if not slot.kind.signed or manifest.layer(DSSE_TYPE) is not None:
            signed.append(manifest)
        else:
            unsigned.append(manifest)
    return signed or unsigned


async def candidate_manifest(
    fs: RegistryBackend, slot: Slot, client: RegistryClient | None = None
) -> Manifest | None:
    """The first of :func:`candidate_manifests` (None if none): what a read or a delete of the
    slot's object takes."""
    found = await candidate_manifests(fs, slot, client=client, first=True)
    return found[0] if found else None


async def attached_names(fs: RegistryBackend) -> list[str]:
    """The object names attached to the subject (a signature's when an entry says signed)."""
    return list(await _attached(fs))
