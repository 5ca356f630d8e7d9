"""A registry repository as the few filesystem calls :class:`~plancache.storage.store.Store` makes.

The store names objects (``startup_plan_<fp>.json``, its ``.sig``, plan sets, compile caches);
this class maps each name to its slot in an artifact (:mod:`.artifacts`) and moves the bytes
with :class:`.registry_http.RegistryClient`, so every command and the plugin reach a registry
through the same bounded paths as any store (deadlines, retries, caps, reports):

* ``_cat_file``: the artifact's manifest by tag, checked, then the layer: embedded (a plan, a
  signature, a small set) or one blob by digest. A plan and its signature read at once share
  one manifest request (in flight, never cached: a later read asks again);
* ``_pipe_file``: read the artifact's manifest, upload the blob, put the manifest with this
  layer replaced, all under one lock per tag in this process;
* ``_rm_file``: a content object deletes its manifest by digest (the tag goes with it), a
  signature is dropped from its manifest;
* a listing is the repository's tags (``tags/list``, page by page, capped: :mod:`.oci_versions`),
  each tag mapped back to the names it holds; with a ``subject``, the image's referrers
  instead (:mod:`.referrers`).

A manifest is the object's only if titled with its name (:func:`.oci_manifests.own_manifest`):
a tag is a pointer anyone who may push can move, and a delete by digest takes every tag on it.

Reads go to the mirror when one is set (``mirror=HOST[:PORT]``, or the node's own mirror
configuration: :mod:`.mirrors`), writes and deletes to the registry itself. A mirror trusted
with content only (containerd's ``pull`` without ``resolve``, registries.conf's
``digest-only``) gets no tag read: the registry says what a tag names (a ``HEAD``), the mirror
serves the manifest by that digest. Nothing here decides about trust: the bytes go to the
trust core as from any other store.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fsspec.asyn import AsyncFileSystem

from ...trust.errors import Reason, Rejected
from . import oci_versions, referrers
from .artifacts import (
    CANARY,
    DSSE_TYPE,
    EMPTY_CONFIG,
    MANIFEST_TYPE,
    MAX_EMBEDDED,
    Slot,
    slot_of,
)
from .oci_manifests import (
    Descriptor,
    Manifest,
    build_manifest,
    is_own,
    own_manifest,
    parse_manifest,
)
from .registry_answers import sha256_digest
from .registry_http import RegistryClient
from .registry_urls import DIGEST


class RegistryFileSystem(AsyncFileSystem):
    """One repository of one registry; made by :func:`.registry_open.registry_opener`."""

    protocol = ("plancache-oci",)
    async_impl = True
    cachable = False

    def __init__(
        self,
        origin: RegistryClient,
        mirror: RegistryClient | None,
        subject: str | None,
        *,
        mirror_resolves: bool = True,
        mirror_pulls: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.origin = origin
        self.reader = mirror if mirror is not None and mirror_pulls else origin
        """Where content is read by digest: manifests, blobs, the referrers API."""
        self.tag_reader = mirror if mirror is not None and mirror_resolves else origin
        """Where a tag is read or resolved: manifests by tag, tag lists."""
        self.repository = origin.repository
        self.subject_text = subject
        self._inflight: dict[str, asyncio.Future[Manifest | None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._config_uploaded = False
        self.subject_state = referrers.SubjectState()

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
        is read: :func:`.referrers.candidate_manifest`).

        Raises:
            Rejected: a manifest of another kind (``malformed``), or titled as another object
                (``name-mismatch``: a tag re-pointed at another object's manifest; see
                :func:`.oci_manifests.own_manifest`).
        """
        if self.subject_text is not None:
            return await referrers.candidate_manifest(self, slot)
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
        (the delete refuses another object's: :meth:`_rm_file`)."""
        if self.subject_text is not None and slot.kind is not CANARY:  # the canary: its tag
            return await referrers.candidate_manifest(self, slot, self.origin)
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

    # -- reads ------------------------------------------------------------------------------------
    async def _cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        name = self.name_of(path)
        slot = slot_of(name)
        manifest = await self.shared_manifest(slot)
        layer = manifest.layer(slot.media_type) if manifest is not None else None
        if layer is None:
            raise FileNotFoundError(name)
        if end is not None and layer.size > end - 1:
            raise Rejected(
                Reason.TOO_LARGE,
                f"{name} in the registry is {layer.size} bytes, the cap is {end - 1}",
            )
        if layer.data is not None:
            return layer.data
        return await self.reader.blob(layer.digest, layer.size, layer.size)

    # -- writes -----------------------------------------------------------------------------------
    async def _ensure_config(self) -> None:
        if not self._config_uploaded:
            await self.origin.put_blob(EMPTY_CONFIG)
            self._config_uploaded = True

    async def _pipe_file(self, path: str, value: bytes, **kwargs: Any) -> None:
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
            digest = await self.origin.put_blob(bytes(value))
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
        subject = await referrers.subject_descriptor(self)
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
        await referrers.after_put(self, subject, new, current)
        replaced = current is not None and current.digest != new.digest
        if replaced and referrers.same_subject(current, subject):
            assert current is not None
            await self.delete_manifest(current)

    async def _rm_file(self, path: str, expected: str | None = None, **kwargs: Any) -> None:
        """Delete the object; with ``expected``, only while its tag names that manifest
        (:class:`.oci_versions.Moved` otherwise)."""
        name = self.name_of(path)
        slot = slot_of(name)
        async with self._lock(slot.tag):
            current = await self.deletable_manifest(slot)
            if current is None or current.layer(slot.media_type) is None:
                raise FileNotFoundError(name)
            if not is_own(current, slot):  # deleting it would delete the other object
                raise oci_versions.Moved(f"{slot.tag} names another object's manifest: not deleted")
            if expected is not None and current.digest != expected:
                raise oci_versions.Moved(f"{slot.tag} names another manifest than the one judged")
            if slot.signature and current.layer(slot.kind.content_type) is not None:
                kept = [d for d in current.layers if d.media_type != DSSE_TYPE]
                await self._put(slot, current, kept)  # the old manifest goes in _put
            else:
                await self.delete_manifest(current)

    async def delete_manifest(self, manifest: Manifest) -> None:
        """Delete one manifest by digest, and its entry in the subject's referrers index first
        (an index must never point at what is gone)."""
        await referrers.forget(self, manifest)
        try:
            await self.origin.delete_manifest(manifest.digest)
        except FileNotFoundError:
            pass

    # -- listings ---------------------------------------------------------------------------------
    async def _ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        """Entries directly under ``path`` (folders made of the names' ``/``)."""
        base = path.rstrip("/")
        under = "" if base == self.repository else self.name_of(base) + "/"
        entries: dict[str, dict[str, Any]] = {}
        for name in await oci_versions.all_names(self):
            if not name.startswith(under):
                continue
            head, sep, _ = name[len(under) :].partition("/")
            full = f"{self.repository}/{under}{head}"
            entries[full] = {"name": full, "type": "directory" if sep else "file", "size": None}
        if not entries and under:
            raise FileNotFoundError(path)
        return list(entries.values()) if detail else sorted(entries)

    async def _info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        if path.rstrip("/") == self.repository:
            body, _ = await self.tag_reader.tags_page(None, 1)
            if not oci_versions.tags_of(body) and await self._absent():
                raise FileNotFoundError(path)
            return {"name": self.repository, "type": "directory", "size": None}
        raise FileNotFoundError(path)

    async def _absent(self) -> bool:
        response = await self.tag_reader.send("GET", f"/v2/{self.repository}/tags/list?n=1")
        async with response:
            return response.status == 404
