"""The layout of a store in a registry: which artifact (tag) holds which object, as which layer.

Every store object plancache names (a plan, its signature, a plan set or replica, a compile
cache's archive and signature, its precompiled headers and their signature) lives in one OCI
1.1 image manifest found by a tag derived from the object's name; the name itself where the
tag grammar allows it (``startup_plan_<fp>.json``, ``startup_planset_<id>.set``), with ``/``
written ``--`` for the compile caches (``torch_compile_cache--torch_aot_compile--<hex>.tar``).
A signature shares its object's manifest (tagged a second time, ``<tag>.sig``, so a listing
of tags says which objects are signed), as a second layer. Every layer of at most
:data:`MAX_EMBEDDED` bytes rides in its descriptor's ``data`` field too (OCI 1.1 embedded
content, checked against the descriptor's digest like a blob): every plan and signature, and
ordinary plan sets. A plan is then **one manifest read**, the fewest round trips a registry
allows for a name (the tag has to be resolved by the registry before anything
content-addressed can be read, and the bytes the manifest's digest binds come with it); and
through a pull-through mirror the object is the manifest, which distribution's proxy stores
before it answers, where a blob's first read costs the origin two fetches (docs/stores.md,
Mirrors). Each layer is uploaded as a blob as well (distribution refuses a manifest whose
layers it lacks; other tools read layers by digest). A larger layer (a compile cache, its
signature, a large plan set) is a blob only, read by digest.

Each kind of object has its own ``artifactType`` (``oras discover`` and registries' UIs show
it), its content its own layer media type, and every manifest carries the object's name as
its ``org.opencontainers.image.title``, so two objects never share a manifest digest (a delete
by digest removes exactly one object).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...trust.compile_cache.manifest import is_subject
from ...trust.errors import Reason, Rejected
from ...trust.plans.plan import fingerprint_of_plan_name, fingerprint_of_sig_name
from ...trust.plans.plan_set_names import set_object_id
from .registry_urls import TAG

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY_CONFIG = b"{}"
EMPTY_DIGEST = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
DSSE_TYPE = "application/vnd.dsse.envelope.v1+json"
TITLE = "org.opencontainers.image.title"
SIGNED = "dev.plancache.signed"
"""Annotation ``"true"`` on a manifest (and its referrer entry) that holds a signature."""
MAX_EMBEDDED = 64 * 1024
"""Largest layer carried inside its manifest (a plan's own cap; base64, two of them keep a
manifest far below the 4 MiB registries accept)."""

CANARY_PREFIX = ".plancache-precondition-check-"
_CANARY = re.compile(r"\.plancache-precondition-check-[0-9a-f]{32}")
_COMPILE_PREFIX = "torch_compile_cache/"


@dataclass(frozen=True)
class Kind:
    """One kind of store object: its artifactType and its content layer's media type."""

    name: str
    artifact_type: str
    content_type: str
    signed: bool


PLAN = Kind(
    "plan", "application/vnd.plancache.plan.v1", "application/vnd.plancache.plan.v1+json", True
)
PLAN_SET = Kind(
    "plan-set",
    "application/vnd.plancache.plan-set.v1",
    "application/vnd.plancache.plan-set.v1+json",
    False,
)
COMPILE_CACHE = Kind(
    "compile-cache",
    "application/vnd.plancache.compile-cache.v1",
    "application/vnd.plancache.compile-cache.v1.tar",
    True,
)
COMPILE_HEADERS = Kind(
    "compile-headers",
    "application/vnd.plancache.compile-headers.v1",
    "application/vnd.plancache.compile-headers.v1+gzip",
    True,
)
CANARY = Kind(
    "precondition-check",
    "application/vnd.plancache.precondition-check.v1",
    "application/octet-stream",
    False,
)
KINDS = (PLAN, PLAN_SET, COMPILE_CACHE, COMPILE_HEADERS, CANARY)
ARTIFACT_TYPES = {kind.artifact_type: kind for kind in KINDS}


@dataclass(frozen=True)
class Slot:
    """Where one named object lives: the artifact's tag and name, and which of its layers."""

    tag: str
    artifact: str
    """The name of the artifact's content object (a signature's is its object's)."""
    kind: Kind
    signature: bool

    @property
    def media_type(self) -> str:
        return DSSE_TYPE if self.signature else self.kind.content_type


def _compile_kind(name: str) -> Kind | None:
    if not name.startswith(_COMPILE_PREFIX):
        return None
    rest = name[len(_COMPILE_PREFIX) :]
    for suffix, kind in ((".tar", COMPILE_CACHE), (".pch.gz", COMPILE_HEADERS)):
        if rest.endswith(suffix) and is_subject(rest[: -len(suffix)]):
            return kind
    return None


def slot_of(name: str) -> Slot:
    """The slot of a store object name; MALFORMED for any name plancache does not write.

    Raises:
        Rejected: not the name of a plancache object (reason ``malformed``).
    """
    signature = False
    artifact = name
    kind: Kind | None = None
    if fingerprint_of_sig_name(name):
        signature, artifact, kind = True, name[: -len(".sig")], PLAN
    elif fingerprint_of_plan_name(name):
        kind = PLAN
    elif set_object_id(name):
        kind = PLAN_SET
    elif _CANARY.fullmatch(name):
        return Slot(name[1:], name, CANARY, False)
    elif name.endswith(".sig") and _compile_kind(name[: -len(".sig")]) is not None:
        signature, artifact = True, name[: -len(".sig")]
        kind = _compile_kind(artifact)
    else:
        kind = _compile_kind(name)
    if kind is None:
        raise Rejected(Reason.MALFORMED, f"not a plancache object name: {name[:80]!r}")
    tag = artifact.replace("/", "--")
    if not TAG.fullmatch(tag):  # every name above fits; a check, not a hope
        raise Rejected(Reason.MALFORMED, f"no tag for {name[:80]!r}")
    return Slot(tag, artifact, kind, signature)


def names_of_tag(tag: str) -> list[str]:
    """The object name a tag stands for, or none for a tag plancache did not make: the
    listing's names, derived and checked, never taken as given. A signature's tag
    (``<artifact tag>.sig``) names the same manifest as its object's, and exists only while that
    manifest holds the signature: a listing says which plans are signed without a read."""
    name = tag.replace("--", "/")
    try:
        slot = slot_of(name)
    except Rejected:
        return []
    if slot.kind is CANARY or slot.tag + (".sig" if slot.signature else "") != tag:
        return []
    return [name]
