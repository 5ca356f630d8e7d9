"""A compile cache on this node, read only: where it lies, what a flow did to it, and whether it
verifies.

A cache directory is ``$VLLM_CACHE_ROOT/torch_compile_cache/<subject>`` (see
:mod:`plancache.trust.compile_cache.manifest`), its signed manifest the sidecar
``<subject>.plancache.sig`` beside it. Verifying keeps one order: the signature first (capped
read, then :func:`~plancache.trust.compile_cache.manifest.verify_manifest`), then the directory's
names, kinds and sizes against the manifest (closed world: nothing unlisted but vLLM's debug
files, :func:`check_names`), only then the files' sha256. Nothing here parses a byte of the
cache, and nothing writes.

Apart from the flows that write (:mod:`.flows`: sign, publish, push, pull) because every one of
them, the plugin's guard (:mod:`.load`) and ``plancache explain`` start from these reads, and
``compile-cache verify`` and ``ls`` are nothing more.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ...storage.compile_cache import cachedir
from ...storage.local.files import read_capped
from ...trust.compile_cache.closed_world import closed_world_difference, digest_difference
from ...trust.compile_cache.manifest import is_subject
from ...trust.compile_cache.manifest_signature import (
    MAX_SIG_OBJECT_BYTES,
    VerifiedManifest,
    verify_manifest,
)
from ...trust.display import safe_text
from ...trust.errors import PlanCacheError, Reason, Rejected
from ...trust.keyring.keys import Keyring
from ..keyless_report import keyless_facts, signers_of


@dataclass(frozen=True)
class CacheOutcome:
    """What one flow did to one cache directory (a row of the CLI's table or JSON)."""

    subject: str
    action: str
    """``verified``, ``signed``, ``pushed``, ``pulled``, ``kept``, ``load``, ``compile``,
    ``quarantined`` or ``rejected``."""
    reason: str = ""
    detail: str = ""
    files: int = 0
    size: int = 0
    signers: tuple[str, ...] = ()
    quarantined_to: str = ""
    key_factors: Mapping[str, Any] | None = None
    """The verified manifest's signed cache-key factors (None: unverified, or none recorded)."""
    measurements: Mapping[str, Any] | None = None
    archive_sha256: str = ""
    """The verified manifest's ``archive_sha256`` ("": unverified): shipped headers are bound to it
    (:mod:`.header_shipping`)."""
    signed_by: tuple[dict[str, Any], ...] = ()
    """Who signed the verified manifest, as a plan's report says it
    (:func:`~plancache.pipeline.keyless_report.signers_of`)."""
    keyless: tuple[dict[str, Any], ...] = ()
    """The verified manifest's keyless signers (identity, issuer, log index and time)."""

    @property
    def ok(self) -> bool:
        return self.action not in ("rejected", "quarantined")


@dataclass(frozen=True)
class CacheRoot:
    """vLLM's cache root and the directories plancache keeps under it."""

    root: Path
    compile_root: Path = field(init=False)
    quarantine_root: Path = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "compile_root", self.root / cachedir.COMPILE_SUBDIR)
        object.__setattr__(self, "quarantine_root", self.root / cachedir.QUARANTINE_SUBDIR)

    def directory(self, subject: str) -> Path:
        """Where the cache ``subject`` lies under this root.

        Raises:
            Rejected: ``subject`` is not a compile-cache directory name (reason ``malformed``).
        """
        if not is_subject(subject):
            raise Rejected(
                Reason.MALFORMED,
                f"'{safe_text(subject, 80)}' is not a compile-cache directory name",
            )
        return self.compile_root / subject

    def subject_of(self, directory: Path) -> str | None:
        """The subject of a cache directory vLLM named, or None if it is not under this root."""
        try:
            subject = (
                Path(os.path.abspath(directory))
                .relative_to(os.path.abspath(self.compile_root))
                .as_posix()
            )
        except ValueError:
            return None
        return subject if is_subject(subject) else None

    def subjects(self) -> list[str]:
        """Cache directories present locally (either layout), sorted; other names are ignored."""
        found = []
        for folder, nested in (
            (self.compile_root, ""),
            (self.compile_root / "torch_aot_compile", "torch_aot_compile/"),
        ):
            try:
                names = os.listdir(folder)
            except (FileNotFoundError, NotADirectoryError):
                continue
            found += [nested + n for n in names if is_subject(nested + n)]
        return sorted(found)


def read_sidecar(directory: Path) -> bytes | None:
    return read_capped(cachedir.sidecar_path(directory), MAX_SIG_OBJECT_BYTES)


def check_names(directory: Path, verified: VerifiedManifest) -> None:
    """The directory's names, kinds and sizes against a verified manifest (closed world). vLLM's
    debug files (``cachedir.DEBUG_FILES``) the manifest does not list are passed over: vLLM
    rewrites them in the shared directory at every boot and never reads them, and only listed
    files are ever copied for vLLM (``private_copy.copy_verified``). A listed one (older
    signatures) is checked.

    Raises:
        Rejected: the directory is a link or not a directory (``malformed``), or its names, kinds
            or sizes differ from the manifest's (``digest-mismatch``).
    """
    if directory.is_symlink() or not directory.is_dir():
        raise Rejected(Reason.MALFORMED, f"{directory} is not a plain directory")
    listed = {f.path for f in verified.manifest.files}
    listing = {
        path: size
        for path, size in cachedir.walk(directory).items()
        if size is None or path in listed or path.rpartition("/")[2] not in cachedir.DEBUG_FILES
    }
    difference = closed_world_difference(verified.manifest, listing)
    if difference:
        raise Rejected(Reason.DIGEST_MISMATCH, difference)


def check_tree(directory: Path, verified: VerifiedManifest) -> None:
    """The directory against a verified manifest: names and sizes first, then contents.

    Raises:
        Rejected: as :func:`check_names`; or a file's sha256 differs from the manifest's
            (``digest-mismatch``).
    """
    check_names(directory, verified)
    listing = {f.path: f.size for f in verified.manifest.files}
    difference = digest_difference(verified.manifest, cachedir.digests(directory, listing))
    if difference:
        raise Rejected(Reason.DIGEST_MISMATCH, difference)


def verify_directory(
    root: CacheRoot, subject: str, keyring: Keyring, now: datetime
) -> VerifiedManifest:
    """Signature, then closed world, then every file's sha256; the verified manifest or a typed
    error (:class:`~plancache.trust.errors.Rejected` from the signature's verification or from
    :func:`check_tree`)."""
    directory = root.directory(subject)
    verified = verify_manifest(subject, read_sidecar(directory), keyring, now)
    check_tree(directory, verified)
    return verified


def outcome_of(
    subject: str, action: str, verified: VerifiedManifest, *, detail: str = ""
) -> CacheOutcome:
    """A verified cache's row: its manifest's counts, signers, factors and archive digest."""
    m = verified.manifest
    return CacheOutcome(
        subject,
        action,
        detail=detail,
        files=len(m.files),
        size=m.total_size,
        signers=verified.signers,
        signed_by=tuple(signers_of(verified)),
        keyless=tuple(keyless_facts(verified.identities)),
        key_factors=m.key_factors,
        measurements=m.measurements,
        archive_sha256=m.archive_sha256,
    )


def verify_cache(root: CacheRoot, subject: str, keyring: Keyring, now: datetime) -> CacheOutcome:
    """``compile-cache verify`` of one cache: ``verified``, or ``rejected`` with the reason."""
    try:
        return outcome_of(subject, "verified", verify_directory(root, subject, keyring, now))
    except PlanCacheError as exc:
        return CacheOutcome(subject, "rejected", exc.reason.value, exc.detail)


def describe_cache(root: CacheRoot, subject: str) -> CacheOutcome:
    """What lies in a cache directory, unverified (``ls`` without trusted keys): counts only."""
    directory = root.directory(subject)
    listing = cachedir.walk(directory)
    files = [size for size in listing.values() if size is not None]
    action = "unverified" if cachedir.sidecar_path(directory).exists() else "unsigned"
    return CacheOutcome(subject, action, "", "no trusted keys given", len(files), sum(files))


def has_files(directory: Path) -> bool:
    """Whether a cache directory holds anything to verify: a file vLLM could read, a sidecar, a
    link or FIFO (something to reject); not empty directories, as vLLM creates them before it
    looks, nor vLLM's debug files alone, which hold nothing torch could read."""
    if directory.is_symlink() or os.path.lexists(cachedir.sidecar_path(directory)):
        return True
    return directory.exists() and not cachedir.leftovers_only(directory)
