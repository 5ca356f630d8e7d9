"""Compile-cache flows shared by the CLI and the plugin: sign, verify, push, pull, publish.

A cache directory is ``$VLLM_CACHE_ROOT/torch_compile_cache/<subject>`` (see
:mod:`plancache.trust.compile_cache.manifest`), its signed manifest the sidecar ``<subject>.plancache.sig``
beside it. Every flow keeps one order: the signature first (capped read, then
:func:`~plancache.trust.compile_cache.manifest.verify_manifest`), then the directory's names, kinds and sizes
against the manifest (closed world: nothing unlisted but vLLM's debug files, :func:`check_names`),
only then the files' sha256. No flow parses a byte of the cache; torch does, after
:func:`plancache.pipeline.compile_cache.load.guard` said ``load``, and then only from the private copy it made.

A pull never replaces a local cache that verifies and was signed at the same time or later
(no rollback by a bucket writer); a cache a build node compiled in private is signed as hashed
there and those bytes put in place by :func:`publish_cache`. Every file written goes through descriptors
(:mod:`plancache.storage.local.dirfds`): no write follows a link.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ...storage.compile_cache import archive_format, archives, cachedir, placement
from ...storage.local import directory_lock, dirfds
from ...storage.local.files import read_capped
from ...storage.store import Store
from ...trust import strictjson
from ...trust.compile_cache.manifest import (
    MAX_SIG_BYTES,
    FileEntry,
    Manifest,
    VerifiedManifest,
    closed_world_difference,
    digest_difference,
    is_subject,
    sign_manifest,
    verify_manifest,
)
from ...trust.display import safe_text
from ...trust.errors import PlanCacheError, Reason, Rejected, StoreError
from ...trust.inputs import check_inputs, keyed_factors, new_salt, without_secrets
from ...trust.keyring.keys import Keyring, Signer, signer_keyring
from ...trust.statement import format_time


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
    """The verified manifest's ``archive_sha256`` ("": unverified): headers are bound to it (headers.py)."""

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
    return read_capped(cachedir.sidecar_path(directory), MAX_SIG_BYTES)


def check_names(directory: Path, verified: VerifiedManifest) -> None:
    """The directory's names, kinds and sizes against a verified manifest (closed world). vLLM's
    debug files (``cachedir.DEBUG_FILES``) the manifest does not list are passed over: vLLM rewrites
    them in the shared directory at every boot and never reads them, and only listed files are
    ever copied for vLLM (``private_copy.copy_verified``). A listed one (older signatures) is checked."""
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


def _check_tree(directory: Path, verified: VerifiedManifest) -> None:
    """The directory against a verified manifest: names and sizes first, then contents."""
    check_names(directory, verified)
    listing = {f.path: f.size for f in verified.manifest.files}
    difference = digest_difference(verified.manifest, cachedir.digests(directory, listing))
    if difference:
        raise Rejected(Reason.DIGEST_MISMATCH, difference)


def verify_directory(
    root: CacheRoot, subject: str, keyring: Keyring, now: datetime
) -> VerifiedManifest:
    """Signature, then closed world, then every file's sha256; the verified manifest or a typed error."""
    directory = root.directory(subject)
    verified = verify_manifest(subject, read_sidecar(directory), keyring, now)
    _check_tree(directory, verified)
    return verified


def outcome_of(
    subject: str, action: str, verified: VerifiedManifest, detail: str = ""
) -> CacheOutcome:
    m = verified.manifest
    return CacheOutcome(
        subject,
        action,
        detail=detail,
        files=len(m.files),
        size=m.total_size,
        signers=verified.signers,
        key_factors=m.key_factors,
        measurements=m.measurements,
        archive_sha256=m.archive_sha256,
    )


def verify_cache(root: CacheRoot, subject: str, keyring: Keyring, now: datetime) -> CacheOutcome:
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


def has_cache(root: CacheRoot, subject: str) -> bool:
    """Whether there is anything to verify: a file vLLM could read, a sidecar, a link or FIFO
    (empty directories, as vLLM creates them before it looks, and vLLM's debug files alone hold
    nothing torch could read)."""
    return has_files(root.directory(subject))


def has_files(directory: Path) -> bool:
    """:func:`has_cache` of a directory path (a link or FIFO inside: something to reject)."""
    if directory.is_symlink() or os.path.lexists(cachedir.sidecar_path(directory)):
        return True
    return directory.exists() and not cachedir.leftovers_only(directory)


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


def sign_cache(
    root: CacheRoot,
    subject: str,
    signer: Signer,
    now: datetime,
    *,
    expires_in: timedelta | None = None,
    comment: str = "",
    wait: float = directory_lock.LOCK_WAIT,
) -> CacheOutcome:
    """Sign the directory as it is (this signer alone) and write the sidecar beside it atomically.
    Signing vouches for bytes this process did not check: run it only where the cache was built."""
    directory = root.directory(subject)
    with directory_lock.locked(root.root, directory, wait=wait, write=True):
        return _sign_locked(root, subject, signer, now, expires_in, comment)


def _sign_locked(
    root: CacheRoot,
    subject: str,
    signer: Signer,
    now: datetime,
    expires_in: timedelta | None,
    comment: str,
) -> CacheOutcome:
    directory = root.directory(subject)
    if directory.is_symlink() or not directory.is_dir():
        raise Rejected(Reason.MALFORMED, f"{directory} is not a plain directory")
    manifest, _ = build_manifest(
        directory, subject, now, now + expires_in if expires_in else None, comment
    )
    sig = sign_manifest(manifest, signer)
    verified = verify_manifest(subject, sig, signer_keyring(signer), now)
    try:
        with dirfds.opened_dir(root.root, directory.parent) as parent:
            dirfds.write_new(parent, cachedir.sidecar_path(directory).name, sig)
    except OSError as exc:
        raise StoreError(
            f"cannot write the signature of {directory}: {exc.strerror or exc}"
        ) from None
    return outcome_of(subject, "signed", verified)


def publish_cache(
    root: CacheRoot,
    subject: str,
    private: Path,
    signer: Signer,
    now: datetime,
    *,
    expires_in: timedelta | None = None,
    key_factors: Mapping[str, Any] | None = None,
    measurements: Mapping[str, Any] | None = None,
    wait: float = directory_lock.LOCK_WAIT,
) -> CacheOutcome:
    """A build node's cache, compiled by vLLM into this boot's private copy ``private`` (this
    process's own 0700 directory), is signed as hashed there, and exactly those bytes go into
    place: the manifest and archive are built from ``private``, the archive is extracted into a
    staging directory beside the target, checked against the manifest and renamed in. Nothing a
    local writer does to the shared directory can be signed (at worst the publish fails), and
    vLLM's debug files there are not signed along. Only if the directory holds no cache (vLLM's
    empty directories and debug files aside; a lone sidecar is moved aside first) when the lock
    is held; else ``kept`` (the directory is left to the next boot's guard)."""
    directory = root.directory(subject)
    with directory_lock.locked(root.root, directory, wait=wait, write=True):
        aside = placement.set_aside_lone_sidecar(root.root, directory, root.quarantine_root)
        if has_files(directory):
            return CacheOutcome(
                subject,
                "kept",
                "",
                "the cache directory changed since this boot's guard; not signed",
            )
        manifest, data = build_manifest(
            private,
            subject,
            now,
            now + expires_in if expires_in else None,
            "",
            key_factors=key_factors,
            measurements=measurements,
        )
        verified = verify_manifest(
            subject, sign_manifest(manifest, signer), signer_keyring(signer), now
        )
        placement.install_archive(
            root.root,
            data,
            manifest,
            directory,
            verified.sig_bytes,
            root.quarantine_root,
            lambda staged: _check_tree(staged, verified),
            "publish",
        )
    return outcome_of(subject, "signed", verified, aside)


def push_cache(
    store: Store,
    root: CacheRoot,
    subject: str,
    keyring: Keyring,
    now: datetime,
    *,
    deadline: float | None = None,
    wait: float = directory_lock.LOCK_WAIT,
) -> CacheOutcome:
    """Upload a cache that verifies under ``keyring``: its archive, then its signature."""
    directory = root.directory(subject)
    with directory_lock.locked(root.root, directory, wait=wait):
        verified = verify_directory(root, subject, keyring, now)
        m = verified.manifest
        data = archive_format.archive_bytes(directory, m.files, m.dirs)
    if hashlib.sha256(data).hexdigest() != m.archive_sha256 or len(data) != m.archive_size:
        raise Rejected(
            Reason.DIGEST_MISMATCH,
            "the rebuilt archive differs from the signed one (another tar writer?); sign again",
        )
    archives.put_object(store, archives.archive_name(subject), data, deadline=deadline)
    archives.put_object(store, archives.sig_name(subject), verified.sig_bytes, deadline=deadline)
    return outcome_of(subject, "pushed", verified, f"{m.archive_size} bytes, {len(m.files)} files")


def pull_cache(
    store: Store,
    root: CacheRoot,
    subject: str,
    keyring: Keyring,
    now: datetime,
    *,
    deadline: float | None = None,
    wait: float = directory_lock.LOCK_WAIT,
) -> CacheOutcome:
    """:func:`_pull_locked` under the node's lock for ``subject``."""
    with directory_lock.locked(root.root, root.directory(subject), wait=wait, write=True):
        return pull_locked(store, root, subject, keyring, now, deadline)


def pull_locked(
    store: Store,
    root: CacheRoot,
    subject: str,
    keyring: Keyring,
    now: datetime,
    deadline: float | None,
) -> CacheOutcome:
    """Signature GET -> verify -> (a local cache that verifies and was signed at the same time
    or later is kept: no rollback) -> archive GET capped at the signed size -> sha256 -> extract
    into a staging directory beside the target -> closed world and every sha256 -> rename
    (:mod:`~plancache.storage.compile_cache.placement`). A lone sidecar is moved aside first."""
    directory = root.directory(subject)
    aside = placement.set_aside_lone_sidecar(root.root, directory, root.quarantine_root)
    sig = archives.get_object(store, archives.sig_name(subject), MAX_SIG_BYTES, deadline=deadline)
    if sig is None:
        raise Rejected(Reason.UNSIGNED, f"no signed compile cache {subject} in {store.url}")
    verified = verify_manifest(subject, sig, keyring, now)
    m = verified.manifest
    kept = _kept_local(root, subject, keyring, now, m)
    if kept is not None:
        return kept
    data = archives.get_object(
        store, archives.archive_name(subject), m.archive_size, deadline=deadline
    )
    if data is None:
        raise StoreError(f"the archive of {subject} is missing from {store.url}")
    if len(data) != m.archive_size or hashlib.sha256(data).hexdigest() != m.archive_sha256:
        raise Rejected(
            Reason.DIGEST_MISMATCH, "the archive does not match its signed sha256 (altered?)"
        )
    placement.install_archive(
        root.root,
        data,
        m,
        directory,
        sig,
        root.quarantine_root,
        lambda staged: _check_tree(staged, verified),
        "pull",
    )
    return outcome_of(subject, "pulled", verified, aside)


def _kept_local(
    root: CacheRoot, subject: str, keyring: Keyring, now: datetime, offered: Manifest
) -> CacheOutcome | None:
    """The local cache, when it verifies and the store's is not strictly newer: a bucket writer
    who puts back an older signed cache never replaces a newer one a node holds."""
    try:
        local = verify_directory(root, subject, keyring, now)
    except PlanCacheError:
        return None
    if local.manifest == offered:
        return outcome_of(subject, "kept", local, "already present and verified")
    if local.manifest.signed_at >= offered.signed_at:
        return outcome_of(
            subject,
            "kept",
            local,
            f"the local cache verifies and was signed {format_time(local.manifest.signed_at)}, "
            f"the store's {format_time(offered.signed_at)}: not replaced by an older one",
        )
    return None
