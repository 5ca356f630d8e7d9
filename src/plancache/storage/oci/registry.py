"""A registry repository as a store's :class:`~..backend.Backend`, reached without fsspec.

The store names objects (``startup_plan_<fp>.json``, its ``.sig``, plan sets, compile caches);
this class maps each name to its slot in an artifact (:mod:`.artifacts`) and moves the bytes
with :class:`.registry_http.RegistryClient`, so every command and the plugin reach a registry
through the same bounded paths as any store (deadlines, retries, caps, reports):

* :meth:`~RegistryBackend.read`: the artifact's manifest by tag, checked, then the layer:
  embedded (a plan, a signature, a small set) or one blob by digest. A plan and its signature
  read at once share one manifest request (in flight, never cached: a later read asks again);
* :meth:`~RegistryBackend.write`: read the artifact's manifest, upload the blob, put the
  manifest with this layer replaced, all under one lock per tag in this process;
* :meth:`~RegistryBackend.delete`: a content object deletes its manifest by digest (the tag
  goes with it), a signature is dropped from its manifest;
* a listing is the repository's tags (``tags/list``, page by page, capped: see below), each
  tag mapped back to the names it holds; with a ``subject``, the image's referrers instead
  (see "Attached to an image" below);
* a version (``prune``'s, :mod:`..conditional_deletes`) is the manifest's digest: see below.

A manifest is the object's only if titled with its name (:func:`.oci_manifests.own_manifest`):
a tag is a pointer anyone who may push can move, and a delete by digest takes every tag on it.

Reads go to the mirror when one is set (``mirror=HOST[:PORT]``, or the node's own mirror
configuration: :mod:`.mirrors`), writes and deletes to the registry itself. A mirror trusted
with content only (containerd's ``pull`` without ``resolve``, registries.conf's
``digest-only``) gets no tag read: the registry says what a tag names (a ``HEAD``), the mirror
serves the manifest by that digest. Nothing here decides about trust: the bytes go to the
trust core as from any other store.

Versions and listings.

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
(:meth:`RegistryBackend.candidate_manifest`), so ``prune --subject`` deletes the one that
failed.

The listing page is one ``tags/list`` page (the token is the last tag seen), mapped to the
names plancache writes; a tag of anything else is skipped. A registry pages ``tags/list`` as it
likes (``Link: rel="next"``, forever if it is hostile; some ignore ``?n`` and send every tag at
once, one capped answer), so at most :data:`..listing.MAX_NAMES` names are kept, the cap every
store's listing has: the page that passes it is the last one read. Memory is then bounded by the
cap and one page (:data:`.registry_answers.TAGS_CAP`), whatever the registry says follows; the
deadline bounds the time. With a ``subject`` the names are the image's referrers (one index,
itself capped at :data:`.oci_manifests.MAX_REFERRERS` entries).

Attached to an image (OCI 1.1 ``subject``): pushed, listed, read and forgotten.

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
import json
from dataclasses import dataclass
from typing import Any

from ...trust.errors import Reason, Rejected, StoreError
from .. import listing
from ..fsspec_backends import CONCURRENCY
from ..listing import Page, entry_info
from ..versioned import Versioned
from .artifacts import (
    ARTIFACT_TYPES,
    CANARY,
    DSSE_TYPE,
    EMPTY_CONFIG,
    INDEX_TYPE,
    MANIFEST_TYPE,
    MAX_EMBEDDED,
    Slot,
    names_of_tag,
    slot_of,
)
from .mirrors import mirror_reads
from .oci_manifests import (
    Descriptor,
    Manifest,
    build_index,
    build_manifest,
    is_own,
    own_manifest,
    parse_index,
    parse_manifest,
)
from .registry_answers import MAX_MANIFEST, expect, media_type_of, read_capped, sha256_digest
from .registry_http import RegistryClient
from .registry_urls import DIGEST, TAG, parse_image_reference

FOREIGN = "foreign"
"""The version of what a tag names when it is not a manifest of the object's kind."""

TAGS_PAGE = 1000
MAX_TAG_PAGES = 1000

IMAGE_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
"""What a ``subject`` may be: an image manifest or index, OCI's or docker's."""

MAX_CANDIDATES = 8
"""Manifests attached with one object's title that a reader tries, newest first: one that
fails its checks (another kind, another title, no content, or, for a signed kind, no
signature) does not hide the next; ``prune --subject`` deletes one that fails verification."""


class Moved(Exception):
    """The tag no longer names the manifest judged: the conditional delete's 412."""

    status = 412


@dataclass(frozen=True)
class Candidate:
    """One signed manifest attached with the object's title: its digest, its signature's bytes
    (unverified) and its content layer (read by :func:`.candidate_reads.candidate_content`)."""

    digest: str
    signature: bytes
    content: Descriptor


class RegistryBackend:
    """One repository of one registry; made by :func:`.registry_open.registry_opener`.

    ``origin`` is the registry itself (every write and delete, ``prune``'s re-reads), ``mirror``
    the one reads may go to (``mirror_resolves``: it may say what a tag names;
    ``mirror_pulls``: it may serve content by digest), ``subject`` the image every object is
    attached to (``--subject``), else None.
    """

    scheme = "oci"
    concurrency = CONCURRENCY
    preconditions = True
    paged = False
    opened = True
    direct = None

    def __init__(
        self,
        origin: RegistryClient,
        mirror: RegistryClient | None,
        subject: str | None,
        *,
        mirror_resolves: bool = True,
        mirror_pulls: bool = True,
    ) -> None:
        self.origin = origin
        self.reader = mirror if mirror is not None and mirror_pulls else origin
        """Where content is read by digest: manifests, blobs, the referrers API."""
        self.tag_reader = mirror if mirror is not None and mirror_resolves else origin
        """Where a tag is read or resolved: manifests by tag, tag lists."""
        self.repository = origin.repository
        self.subject = subject
        self._inflight: dict[str, asyncio.Future[Manifest | None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._config_uploaded = False
        self._uploading: dict[str, asyncio.Future[str]] = {}
        """Blob uploads under way, by digest: a write needing a blob already on its way awaits
        that upload instead of starting its own (:meth:`_upload`)."""
        self._subject_lock = asyncio.Lock()
        self._subject_image: Descriptor | None = None
        """The subject's descriptor, its tag resolved once."""
        self._index_lock = asyncio.Lock()
        self._attached_names: dict[str, list[str]] | None = None
        """What is attached to the subject, read once (forgotten at each write or delete)."""

    def open(self) -> None:
        """Nothing to make: the registry's sessions open at their first request."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """fsspec's IO loop, the one every other store's calls share (its daemon thread)."""
        from fsspec.asyn import get_loop

        return get_loop()

    def served_from(self) -> list[tuple[str, str]]:
        return mirror_reads.mirrors_read(f"{self.origin.registry.authority}/{self.repository}")

    # -- names -----------------------------------------------------------------------------------
    def name_of(self, path: str) -> str:
        """The object name of ``path`` under the repository.

        Raises:
            FileNotFoundError: ``path`` is not under the repository.
        """
        prefix = self.repository + "/"
        if not path.startswith(prefix):
            raise FileNotFoundError(path)
        return path[len(prefix) :]

    def _lock(self, key: str) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    # -- manifests -------------------------------------------------------------------------------
    async def fetch_manifest(self, slot: Slot) -> Manifest | None:
        """The slot's manifest for a read, checked (None if absent): at its tag, or, for reads
        with a subject, from the candidates the image's referrers name (only what is attached
        is read: :meth:`candidate_manifest`).

        Raises:
            Rejected: a manifest of another kind (``malformed``), or titled as another object
                (``name-mismatch``: a tag re-pointed at another object's manifest; see
                :func:`.oci_manifests.own_manifest`).
        """
        if self.subject is not None:
            return await self.candidate_manifest(slot)
        manifest = await self.tagged_manifest(slot)
        return own_manifest(manifest, slot) if manifest is not None else None

    async def tagged_manifest(
        self, slot: Slot, client: RegistryClient | None = None, reference: str | None = None
    ) -> Manifest | None:
        """The manifest at the slot's tag (or ``reference``), parsed as the slot's kind, its
        title not yet compared (None if absent)."""
        reference = reference or slot.tag
        if client is not None:
            got = await client.manifest(reference, (MANIFEST_TYPE,))
        else:
            got = await self.read_manifest(reference, (MANIFEST_TYPE,))
        if got is None:
            return None
        body, digest = got
        return parse_manifest(body, digest, slot.kind, f"manifest {slot.tag}")

    async def read_manifest(
        self, reference: str, media_types: tuple[str, ...]
    ) -> tuple[bytes, str] | None:
        """(bytes, digest) of a manifest by digest or tag from the readers (None if absent): a
        digest from the content reader; a tag from the tag reader, or, when the mirror serves
        digests only, resolved by the registry (a ``HEAD``) and then read by digest."""
        if DIGEST.fullmatch(reference) or self.tag_reader is self.reader:
            return await self.reader.manifest(reference, media_types)
        stated = await self.tag_reader.resolve(reference, media_types)
        if stated is None:
            return None
        if not stated:  # the registry did not say: read the tag there
            return await self.tag_reader.manifest(reference, media_types)
        return await self.reader.manifest(stated, media_types)

    async def deletable_manifest(self, slot: Slot) -> Manifest | None:
        """The manifest a delete of the slot's object would delete, from the registry itself:
        the attached candidate with a subject, else the tag's manifest, its title not compared
        (the delete refuses another object's: :meth:`_remove`)."""
        if self.subject is not None and slot.kind is not CANARY:  # the canary: its tag
            return await self.candidate_manifest(slot, self.origin)
        return await self.tagged_manifest(slot, self.origin)

    async def shared_manifest(self, slot: Slot) -> Manifest | None:
        """:meth:`fetch_manifest`, one request for every reader of the tag at this moment."""
        task = self._inflight.get(slot.tag)
        if task is None:
            task = asyncio.ensure_future(self.fetch_manifest(slot))
            self._inflight[slot.tag] = task

            def forget(done: asyncio.Future[Manifest | None], tag: str = slot.tag) -> None:
                if self._inflight.get(tag) is done:
                    del self._inflight[tag]

            task.add_done_callback(forget)
        return await task

    # -- reads ----------------------------------------------------------------------------------
    async def read(self, path: str, cap: int) -> bytes | None:
        """The object's layer (None if absent): embedded in its manifest, or its blob by digest,
        refused past ``cap`` by the size the manifest states, before the blob is asked for.

        Raises:
            Rejected: larger than ``cap`` (reason ``too-large``), or the registry's answers fail
                their checks.
        """
        try:
            name = self.name_of(path)
        except FileNotFoundError:
            return None
        slot = slot_of(name)
        manifest = await self.shared_manifest(slot)
        layer = manifest.layer(slot.media_type) if manifest is not None else None
        if layer is None:
            return None
        if layer.size > cap:
            raise Rejected(
                Reason.TOO_LARGE,
                f"{name} in the registry is {layer.size} bytes, the cap is {cap}",
            )
        if layer.data is not None:
            return layer.data
        return await self.reader.blob(layer.digest, layer.size, layer.size)

    async def read_versioned(self, path: str, cap: int) -> Versioned:
        """The object's bytes (at most ``cap``) and its manifest's digest, from the registry.

        Raises:
            FileNotFoundError: no manifest at the object's tag, or none of the object's kind in
                it.
            Rejected: the object is larger than ``cap`` (reason ``too-large``), or the
                registry's answers fail their checks (:meth:`.registry_http.RegistryClient.blob`).
        """
        slot = slot_of(self.name_of(path))
        try:
            manifest = await self.deletable_manifest(slot)
        except Rejected as exc:
            if exc.reason is not Reason.MALFORMED:
                raise
            # another kind's manifest (a co-tenant's image, say) at the object's tag: never the
            # object judged, so never deleted as it (the same digest is the image's), and one
            # such tag must not fail the whole prune: it reads as changed, and is kept
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
            else await self.origin.blob(layer.digest, layer.size, cap)
        )
        return Versioned(data, manifest.digest)

    # -- writes -----------------------------------------------------------------------------------
    async def _upload(self, data: bytes) -> str:
        """``data``'s blob in the repository (:meth:`RegistryClient.put_blob`), one upload of
        a digest at a time however many writes need it at once: every manifest names the empty
        config, and the copies of a plan set are the same bytes. Two uploads of one digest
        racing each other made distribution 2.8 (docker-registry) refuse a third write's
        manifest, PUT meanwhile, with 400 MANIFEST_BLOB_UNKNOWN: about half the pushes of nine
        plans to a new repository failed. Once it ends, the next write asks the registry again."""
        digest = sha256_digest(data)
        upload = self._uploading.get(digest)
        if upload is None:
            upload = self._uploading[digest] = asyncio.ensure_future(self.origin.put_blob(data))
            upload.add_done_callback(lambda _: self._uploading.pop(digest, None))
        return await asyncio.shield(upload)

    async def _ensure_config(self) -> None:
        if not self._config_uploaded:
            await self._upload(EMPTY_CONFIG)
            self._config_uploaded = True

    async def write(self, path: str, data: bytes) -> None:
        value = data
        slot = slot_of(self.name_of(path))
        async with self._lock(slot.tag):
            try:
                current = await self.tagged_manifest(slot, self.origin)
            except Rejected as exc:  # another kind's manifest at the tag: a co-tenant's
                if exc.reason is not Reason.MALFORMED:
                    raise
                current = None
            if current is not None and not is_own(current, slot):
                current = None  # another object's manifest: neither kept from nor deleted
            digest = await self._upload(bytes(value))
            await self._ensure_config()
            layer = Descriptor(
                slot.media_type,
                digest,
                len(value),
                bytes(value) if len(value) <= MAX_EMBEDDED else None,
                title=self.name_of(path),
            )
            kept = [
                d for d in (current.layers if current else ()) if d.media_type != layer.media_type
            ]
            await self._put(slot, current, [*kept, layer])

    async def _put(self, slot: Slot, current: Manifest | None, layers: list[Descriptor]) -> None:
        """PUT the slot's manifest with ``layers`` (content first), attached to the subject; the
        manifest it replaces is deleted when attached to the same image (or both to none)."""
        layers.sort(key=lambda d: d.media_type == DSSE_TYPE)
        subject = await self.subject_descriptor()
        body = build_manifest(
            slot.kind,
            slot.artifact,
            layers,
            subject,
            {d.digest for d in layers if d.data is not None},
        )
        signed = any(d.media_type == DSSE_TYPE for d in layers)
        await self.origin.put_manifest(slot.tag, body, MANIFEST_TYPE)
        if signed:  # the signature's own tag
            await self.origin.put_manifest(slot.tag + ".sig", body, MANIFEST_TYPE)
        new = Descriptor(
            MANIFEST_TYPE,
            sha256_digest(body),
            len(body),
            None,
            slot.kind.artifact_type,
            slot.artifact,
            signed,
        )
        await self._index_put(subject, new, current)
        replaced = current is not None and current.digest != new.digest
        if replaced and same_subject(current, subject):
            assert current is not None
            await self.delete_manifest(current)

    async def delete(self, path: str) -> None:
        try:
            await self._remove(path, None)
        except FileNotFoundError:
            pass

    async def delete_if_unchanged(self, path: str, token: str) -> None:
        """Delete the object if its tag still names manifest ``token``; :class:`Moved`
        otherwise (FileNotFoundError if it is gone)."""
        await self._remove(path, token)

    async def _remove(self, path: str, expected: str | None) -> None:
        """Delete the object; with ``expected``, only while its tag names that manifest
        (:class:`Moved` otherwise)."""
        name = self.name_of(path)
        slot = slot_of(name)
        async with self._lock(slot.tag):
            current = await self.deletable_manifest(slot)
            if current is None or current.layer(slot.media_type) is None:
                raise FileNotFoundError(name)
            if not is_own(current, slot):  # deleting it would delete the other object
                raise Moved(f"{slot.tag} names another object's manifest: not deleted")
            if expected is not None and current.digest != expected:
                raise Moved(f"{slot.tag} names another manifest than the one judged")
            if slot.signature and current.layer(slot.kind.content_type) is not None:
                kept = [d for d in current.layers if d.media_type != DSSE_TYPE]
                await self._put(slot, current, kept)  # the old manifest goes in _put
            else:
                await self.delete_manifest(current)

    async def delete_manifest(self, manifest: Manifest) -> None:
        """Delete one manifest by digest, and its entry in the subject's referrers index first
        (an index must never point at what is gone)."""
        await self._unindex(manifest)
        try:
            await self.origin.delete_manifest(manifest.digest)
        except FileNotFoundError:
            pass

    # -- listings ---------------------------------------------------------------------------------
    async def list_page(self, under: str, token: str | None) -> Page:
        """One listing page of the store's plan, sidecar and set names (the repository's: a
        registry store has no prefix below it)."""
        if self.subject is not None:
            names: list[Any] = await self.all_names()
            following = None
        else:
            names, following = await self.tag_names(start=token, pages=1)
        entries = [info for info in (entry_info(n, None, {}) for n in names) if info is not None]
        return Page(entries, following)

    async def list_dir(self, path: str) -> list[tuple[str, bool]]:
        """Entries directly under ``path`` (folders made of the names' ``/``).

        Raises:
            FileNotFoundError: nothing is under ``path``.
        """
        base = path.rstrip("/")
        under = "" if base == self.repository else self.name_of(base) + "/"
        entries: dict[str, bool] = {}
        for name in await self.all_names():
            if not name.startswith(under):
                continue
            head, sep, _ = name[len(under) :].partition("/")
            entries[f"{self.repository}/{under}{head}"] = bool(sep)
        if not entries and under:
            raise FileNotFoundError(path)
        return list(entries.items())

    async def info(self, path: str) -> dict[str, Any]:
        """The repository as a directory.

        Raises:
            FileNotFoundError: ``path`` is not the repository, or the registry has no such
                repository.
        """
        if path.rstrip("/") == self.repository:
            body, _ = await self.tag_reader.tags_page(None, 1)
            if not tags_of(body) and await self._absent():
                raise FileNotFoundError(path)
            return {"name": self.repository, "type": "directory", "size": None}
        raise FileNotFoundError(path)

    async def _absent(self) -> bool:
        response = await self.tag_reader.send("GET", f"/v2/{self.repository}/tags/list?n=1")
        async with response:
            return response.status == 404

    async def tag_names(
        self,
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
            body, more = await self.tag_reader.tags_page(last, TAGS_PAGE)
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

    async def all_names(self) -> list[str]:
        """Every object name: the subject's attached ones, else the whole tag list (at most
        :data:`..listing.MAX_NAMES` names, in at most MAX_TAG_PAGES pages).

        Raises:
            Rejected: the tag list names more than MAX_NAMES objects or runs past
                MAX_TAG_PAGES pages (reason ``too-large``).
        """
        if self.subject is not None:
            return list(await self._attached())
        names, more = await self.tag_names()
        if len(names) > listing.MAX_NAMES:
            raise Rejected(
                Reason.TOO_LARGE,
                f"the tag list of {self.repository} names more than {listing.MAX_NAMES} objects",
            )
        if more is not None:
            raise Rejected(
                Reason.TOO_LARGE,
                f"the tag list of {self.repository} runs past {MAX_TAG_PAGES} pages",
            )
        return names

    # -- attached to an image (the module docstring's last part) -----------------------------------
    async def subject_descriptor(self) -> Descriptor | None:
        """The subject image's descriptor, its tag resolved to a digest once (None without one).

        Raises:
            StoreError: the image is not in the repository.
        """
        if self.subject is None:
            return None
        async with self._subject_lock:
            if self._subject_image is None:
                ref = parse_image_reference(self.subject, self.origin.registry, self.repository)
                got = await self._image_manifest(ref.digest or ref.tag or "")
                if got is None:
                    raise StoreError(f"--subject {ref}: no such image in {self.repository}")
                self._subject_image = got
            return self._subject_image

    async def _image_manifest(self, reference: str) -> Descriptor | None:
        client = self.reader if reference.startswith("sha256:") else self.tag_reader
        response = await client.manifest_answer("GET", reference, IMAGE_TYPES, f"image {reference}")
        if response is None:
            return None
        async with response:
            media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
            body = await read_capped(response, MAX_MANIFEST, f"image {reference}")
        digest = sha256_digest(body)
        if media_type not in IMAGE_TYPES or (
            reference.startswith("sha256:") and digest != reference
        ):
            raise StoreError(
                f"--subject: {reference} is not an image manifest the registry vouches for"
            )
        return Descriptor(media_type, digest, len(body))

    async def _tag_schema_index(self, subject_digest: str, origin: bool) -> list[Descriptor] | None:
        tag = fallback_tag(subject_digest)
        if origin:
            got = await self.origin.manifest(tag, (INDEX_TYPE,))
        else:
            got = await self.read_manifest(tag, (INDEX_TYPE,))
        return None if got is None else parse_index(got[0], "the referrers index")

    async def _rewrite_index(
        self, subject_digest: str, drop: set[str], add: Descriptor | None
    ) -> None:
        async with self._index_lock:
            entries = await self._tag_schema_index(subject_digest, origin=True)
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
            await self.origin.put_manifest(
                fallback_tag(subject_digest), build_index(kept), INDEX_TYPE
            )

    async def _index_put(
        self, subject: Descriptor | None, new: Descriptor, replaced: Manifest | None
    ) -> None:
        """Index a manifest just put with ``subject`` in the tag schema, also where the
        registry's own referrers API took it (``OCI-Subject``: see the module docstring); the
        manifest it replaced for the same image leaves the index (one attached to another image
        stays attached to that one)."""
        self._attached_names = None
        if subject is None:
            return
        old = (
            {replaced.digest} if same_subject(replaced, subject) and replaced is not None else set()
        )
        await self._rewrite_index(subject.digest, old, new)

    async def _unindex(self, manifest: Manifest) -> None:
        """Drop ``manifest`` from its subject's tag-schema index, before it is deleted."""
        self._attached_names = None
        if manifest.subject is not None:
            await self._rewrite_index(manifest.subject.digest, {manifest.digest}, None)

    async def _referrers_api_index(self, digest: str) -> bytes | None:
        """The referrers API's index for ``digest`` (from the content reader: a digest's
        question); None where there is no such API (distribution 2.8, and its proxy: a 404)."""
        client = self.reader
        response = await client.send(
            "GET", f"/v2/{client.repository}/referrers/{digest}", headers={"Accept": INDEX_TYPE}
        )
        async with response:
            if response.status in (404, 405, 400) or media_type_of(response.headers) != INDEX_TYPE:
                return None
            await expect(response, (200,), "the referrers of the image")
            return await read_capped(response, MAX_MANIFEST, "the referrers index")

    async def _attached(self) -> dict[str, list[str]]:
        """Name -> digests of the plancache manifests attached to the subject with that title,
        newest first (the index's later entries: the tag schema appends), at most
        MAX_CANDIDATES each; a signature's name when an entry says signed."""
        subject = await self.subject_descriptor()
        assert subject is not None
        async with self._index_lock:
            if self._attached_names is None:
                body = await self._referrers_api_index(subject.digest)
                entries = (
                    parse_index(body, "the referrers of the image")
                    if body is not None
                    else await self._tag_schema_index(subject.digest, origin=False) or []
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
                self._attached_names = attached
            return self._attached_names

    async def candidate_manifests(
        self,
        slot: Slot,
        *,
        client: RegistryClient | None = None,
        first: bool = False,
    ) -> list[Manifest]:
        """The manifests attached to the subject that are the slot's object's own (its kind, its
        title, attached to this image) and hold its content, newest first; for a kind that is
        signed, those holding a signature too come first (a plan and its signature are read
        from one manifest). At most MAX_CANDIDATES manifests are read; one that fails its checks
        is skipped, so an unsigned or malformed referrer titled like a plan does not hide the
        signed one. A manifest whose own ``subject`` is another image is skipped too: the
        tag-schema index is a tag anyone who may push can rewrite, and a co-tenant who lists
        image Y's plan there would have it read as X's, and ``prune --subject X`` delete it
        from Y. ``client`` reads from there (the registry itself, for ``prune``'s re-read);
        ``first``: stop at the first that holds all it should (one read in the ordinary
        case)."""
        subject = await self.subject_descriptor()
        names = await self._attached()
        signed: list[Manifest] = []
        unsigned: list[Manifest] = []
        for digest in names.get(slot.artifact, [])[:MAX_CANDIDATES]:
            if signed and first:
                break
            try:
                manifest = await self.tagged_manifest(slot, client, digest)
            except Rejected:
                continue
            if (
                manifest is None
                or not is_own(manifest, slot)
                or not same_subject(manifest, subject)
            ):
                continue
            if manifest.layer(slot.kind.content_type) is None:
                continue
            if not slot.kind.signed or manifest.layer(DSSE_TYPE) is not None:
                signed.append(manifest)
            else:
                unsigned.append(manifest)
        return signed or unsigned

    async def candidate_manifest(
        self, slot: Slot, client: RegistryClient | None = None
    ) -> Manifest | None:
        """The first of :meth:`candidate_manifests` (None if none): what a read or a delete of
        the slot's object takes."""
        found = await self.candidate_manifests(slot, client=client, first=True)
        return found[0] if found else None

    async def other_candidates(self, name: str, sig_cap: int) -> list[Candidate]:
        """Each signed candidate for object ``name`` after the one a read takes, newest first,
        its signature read (at most ``sig_cap`` bytes, unverified: the reader verifies;
        :mod:`.candidate_reads` says why)."""
        slot = slot_of(name)
        found = []
        for manifest in (await self.candidate_manifests(slot))[1:]:
            content, signature = manifest.layer(slot.kind.content_type), manifest.layer(DSSE_TYPE)
            if content is None or signature is None:
                continue
            try:
                sig = signature.data
                if sig is None:
                    sig = await self.reader.blob(signature.digest, signature.size, sig_cap)
            except (Rejected, FileNotFoundError):  # too large, altered, gone: not a candidate
                continue
            found.append(Candidate(manifest.digest, sig, content))
        return found


def fallback_tag(digest: str) -> str:
    """The referrers tag schema's tag for the image at ``digest``."""
    return "sha256-" + digest.split(":", 1)[1]


def same_subject(manifest: Manifest | None, subject: Descriptor | None) -> bool:
    """Whether ``manifest`` is attached to ``subject`` (both to none counts)."""
    if manifest is None:
        return False
    mine = manifest.subject.digest if manifest.subject is not None else None
    return mine == (subject.digest if subject is not None else None)


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
