"""OCI 1.1 manifests and indexes plancache writes, and the strict reading of those it is sent.

A manifest from a registry is hostile input: parsed without duplicate keys or NaN
(:mod:`plancache.trust.strictjson`), it must be an image manifest of the ``artifactType`` the
name's kind has (:mod:`.artifacts`), every descriptor well formed (a ``sha256`` digest, a
size, at most a few layers), and a descriptor's embedded ``data`` must be exactly the bytes
its digest and size name. Anything else is ``malformed`` or ``digest-mismatch``, never used.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from ...trust.display import safe_text
from ...trust.errors import Reason, Rejected
from ...trust.strictjson import loads
from .artifacts import (
    DSSE_TYPE,
    EMPTY_DIGEST,
    EMPTY_TYPE,
    INDEX_TYPE,
    MANIFEST_TYPE,
    SIGNED,
    TITLE,
    Kind,
    Slot,
)
from .registry_answers import sha256_digest
from .registry_urls import DIGEST

MAX_LAYERS = 4
MAX_REFERRERS = 10_000
MAX_SIZE = 1 << 53


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    data: bytes | None = None
    artifact_type: str | None = None
    title: str | None = None
    signed: bool = False

    def as_json(self, *, embed: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mediaType": self.media_type,
            "digest": self.digest,
            "size": self.size,
        }
        if embed and self.data is not None:
            out["data"] = base64.b64encode(self.data).decode()
        if self.artifact_type:
            out["artifactType"] = self.artifact_type
        if self.title:
            out["annotations"] = {TITLE: self.title, **({SIGNED: "true"} if self.signed else {})}
        return out


@dataclass(frozen=True)
class Manifest:
    """A checked plancache manifest: its bytes' digest, layers and subject."""

    digest: str
    size: int
    kind: Kind
    title: str | None
    layers: tuple[Descriptor, ...]
    subject: Descriptor | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def layer(self, media_type: str) -> Descriptor | None:
        return next((d for d in self.layers if d.media_type == media_type), None)


def _text(value: Any, limit: int = 255) -> str | None:
    return (
        value
        if isinstance(value, str) and 0 < len(value) <= limit and value.isprintable()
        else None
    )


def descriptor(value: Any, what: str) -> Descriptor:
    """A descriptor checked field by field; an embedded ``data`` checked against it.

    Raises:
        Rejected: not an object, or without a media type, sha256 digest or size (reason
            ``malformed``); embedded data that is not the descriptor's bytes
            (``digest-mismatch``).
    """
    if not isinstance(value, dict):
        raise Rejected(Reason.MALFORMED, f"{what}: a descriptor is not an object")
    media_type, digest, size = _text(value.get("mediaType")), value.get("digest"), value.get("size")
    if media_type is None or not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise Rejected(
            Reason.MALFORMED, f"{what}: a descriptor without a media type or sha256 digest"
        )
    if type(size) is not int or not 0 <= size < MAX_SIZE:
        raise Rejected(Reason.MALFORMED, f"{what}: a descriptor without a size")
    data = None
    if "data" in value:
        raw = value["data"]
        try:
            data = base64.b64decode(raw, validate=True) if isinstance(raw, str) else None
        except (binascii.Error, ValueError):
            data = None
        if data is None or len(data) != size or sha256_digest(data) != digest:
            raise Rejected(
                Reason.DIGEST_MISMATCH, f"{what}: embedded data that is not the descriptor's bytes"
            )
    annotations = value.get("annotations")
    notes = annotations if isinstance(annotations, dict) else {}
    return Descriptor(
        media_type,
        digest,
        size,
        data,
        _text(value.get("artifactType")),
        _text(notes.get(TITLE)),
        notes.get(SIGNED) == "true",
    )


def parse_manifest(body: bytes, digest: str, kind: Kind, what: str) -> Manifest:
    """A plancache manifest of ``kind``; MALFORMED for anything else.

    Raises:
        Rejected: not a manifest of this kind (``malformed``), embedded data that does not
            match its descriptor (``digest-mismatch``).
    """
    doc = loads(body, what)
    if not isinstance(doc, dict) or doc.get("schemaVersion") != 2:
        raise Rejected(Reason.MALFORMED, f"{what} is not an OCI manifest")
    if doc.get("mediaType") != MANIFEST_TYPE:
        raise Rejected(Reason.MALFORMED, f"{what} is not an OCI image manifest")
    if doc.get("artifactType") != kind.artifact_type:
        shown = safe_text(str(doc.get("artifactType")), 80)
        raise Rejected(
            Reason.MALFORMED, f"{what} is a {shown!r} artifact, not a {kind.artifact_type}"
        )
    layers = doc.get("layers")
    if not isinstance(layers, list) or not 0 < len(layers) <= MAX_LAYERS:
        raise Rejected(Reason.MALFORMED, f"{what}: no layers, or more than {MAX_LAYERS}")
    subject = doc.get("subject")
    annotations = doc.get("annotations")
    return Manifest(
        digest,
        len(body),
        kind,
        _text(annotations.get(TITLE)) if isinstance(annotations, dict) else None,
        tuple(descriptor(layer, what) for layer in layers),
        descriptor(subject, what) if subject is not None else None,
    )


def is_own(manifest: Manifest, slot: Slot) -> bool:
    """Whether ``manifest`` is the slot's object's: titled with its name (the kind, its
    ``artifactType``, was checked by the parse)."""
    return manifest.title == slot.artifact


def own_manifest(manifest: Manifest, slot: Slot) -> Manifest:
    """``manifest`` if it is the slot's object's own.

    A tag is only a pointer anyone who may push can move: a co-tenant who PUTs plan A's
    manifest under plan B's tag would make B read as A, and a delete of "B" by digest would
    delete A (distribution drops every tag on a deleted digest). Every manifest plancache
    writes is titled with its object's name, so a manifest titled otherwise is not the object
    the tag names.

    Raises:
        Rejected: titled as another object, or not at all (reason ``name-mismatch``).
    """
    if not is_own(manifest, slot):
        shown = safe_text(manifest.title or "(none)", 120)
        raise Rejected(
            Reason.NAME_MISMATCH,
            f"the manifest at tag {slot.tag} is titled {shown!r}: another object's, not "
            f"{slot.artifact} (a tag re-pointed in the registry)",
        )
    return manifest


def _dump(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def build_manifest(
    kind: Kind, title: str, layers: list[Descriptor], subject: Descriptor | None, embed: set[str]
) -> bytes:
    """The manifest of one object: the empty config, ``layers`` (those whose digest is in
    ``embed`` with their bytes inline), the object's name as its title, and its subject."""
    doc: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "artifactType": kind.artifact_type,
        "config": {"mediaType": EMPTY_TYPE, "digest": EMPTY_DIGEST, "size": 2, "data": "e30="},
        "layers": [d.as_json(embed=d.digest in embed) for d in layers],
        "annotations": {TITLE: title},
    }
    if any(d.media_type == DSSE_TYPE for d in layers):
        doc["annotations"][SIGNED] = "true"
    if subject is not None:
        doc["subject"] = subject.as_json()
    return _dump(doc)


def parse_index(body: bytes, what: str) -> list[Descriptor]:
    """The manifests an index (a referrers answer or tag-schema index) lists, each checked;
    entries that are not descriptors are dropped (another tool's are not ours to judge).

    Raises:
        Rejected: not strict JSON, not an OCI index, or without a manifests list or with a too
            long one (reason ``malformed``).
    """
    doc = loads(body, what)
    if not isinstance(doc, dict) or doc.get("schemaVersion") != 2:
        raise Rejected(Reason.MALFORMED, f"{what} is not an OCI index")
    entries = doc.get("manifests")
    if not isinstance(entries, list) or len(entries) > MAX_REFERRERS:
        raise Rejected(Reason.MALFORMED, f"{what}: no manifests list, or a too long one")
    out = []
    for entry in entries:
        try:
            out.append(descriptor(entry, what))
        except Rejected:
            continue
    return out


def build_index(entries: list[Descriptor]) -> bytes:
    return _dump(
        {
            "schemaVersion": 2,
            "mediaType": INDEX_TYPE,
            "manifests": [d.as_json() for d in entries],
        }
    )
