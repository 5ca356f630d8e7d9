"""Compile-cache flows shared by the CLI and the plugin: sign, verify, guard, push, pull.

A cache directory is ``$VLLM_CACHE_ROOT/torch_compile_cache/<subject>`` (see
:mod:`plancache.trust.manifest`), its signed manifest the sidecar ``<subject>.plancache.sig``
beside it. Every flow keeps one order: the signature first (capped read, then
:func:`~plancache.trust.manifest.verify_manifest`), then the directory's names, kinds and sizes
against the manifest (closed world: nothing unlisted), only then the files' sha256. No flow
parses a byte of the cache; torch does, after :func:`guard` said ``load``.

:func:`guard` is what the plugin runs before vLLM's first read: a verified cache is left as it
is; a cache that fails (unsigned, bad signature, wrong name, an extra, missing or altered file,
a link or FIFO) is moved whole into ``$VLLM_CACHE_ROOT/plancache-quarantine/`` (evidence kept,
never loaded) and vLLM compiles afresh. A directory with no files yet (vLLM creates
``inductor_cache/`` before it looks) has nothing to read and is left alone.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from ..storage import archives, cachedir
from ..storage.files import read_capped, write_atomic
from ..storage.store import Store
from ..trust.display import safe_text
from ..trust.errors import PlanCacheError, Reason, Rejected, StoreError
from ..trust.keys import Keyring, Signer, signer_keyring
from ..trust.manifest import (
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
            raise Rejected(Reason.MALFORMED, f"'{safe_text(subject, 80)}' is not a compile-cache directory name")
        return self.compile_root / subject

    def subject_of(self, directory: Path) -> str | None:
        """The subject of a cache directory vLLM named, or None if it is not under this root."""
        try:
            subject = Path(os.path.abspath(directory)).relative_to(os.path.abspath(self.compile_root)).as_posix()
        except ValueError:
            return None
        return subject if is_subject(subject) else None

    def subjects(self) -> list[str]:
        """Cache directories present locally (either layout), sorted; other names are ignored."""
        found = []
        for folder, nested in ((self.compile_root, ""), (self.compile_root / "torch_aot_compile", "torch_aot_compile/")):
            try:
                names = os.listdir(folder)
            except (FileNotFoundError, NotADirectoryError):
                continue
            found += [nested + n for n in names if is_subject(nested + n)]
        return sorted(found)


def _read_sidecar(directory: Path) -> bytes | None:
    return read_capped(cachedir.sidecar_path(directory), MAX_SIG_BYTES)


def _check_tree(directory: Path, verified: VerifiedManifest) -> None:
    """The directory against a verified manifest: names and sizes first, then contents."""
    if directory.is_symlink() or not directory.is_dir():
        raise Rejected(Reason.MALFORMED, f"{directory} is not a plain directory")
    manifest = verified.manifest
    difference = closed_world_difference(manifest, cachedir.walk(directory))
    if not difference:
        listing = {f.path: f.size for f in manifest.files}
        difference = digest_difference(manifest, cachedir.digests(directory, listing))
    if difference:
        raise Rejected(Reason.DIGEST_MISMATCH, difference)


def verify_directory(root: CacheRoot, subject: str, keyring: Keyring, now: datetime) -> VerifiedManifest:
    """Signature, then closed world, then every file's sha256; the verified manifest or a typed error."""
    directory = root.directory(subject)
    verified = verify_manifest(subject, _read_sidecar(directory), keyring, now)
    _check_tree(directory, verified)
    return verified


def _outcome(subject: str, action: str, verified: VerifiedManifest, detail: str = "") -> CacheOutcome:
    m = verified.manifest
    return CacheOutcome(subject, action, detail=detail, files=len(m.files), size=m.total_size, signers=verified.signers)


def verify_cache(root: CacheRoot, subject: str, keyring: Keyring, now: datetime) -> CacheOutcome:
    try:
        return _outcome(subject, "verified", verify_directory(root, subject, keyring, now))
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
    """Whether there is anything to verify: a file, a sidecar, a link or FIFO (empty directories
    alone, as vLLM creates them before it looks, hold nothing torch could read)."""
    return _has_files(root.directory(subject))


def _has_files(directory: Path) -> bool:
    if directory.is_symlink() or cachedir.sidecar_path(directory).exists():
        return True
    if not directory.exists():
        return False
    try:
        return any(size is not None for size in cachedir.walk(directory).values())
    except PlanCacheError:
        return True  # a link or FIFO somewhere: something to reject


def guard(root: CacheRoot, subject: str, keyring: Keyring | None, now: datetime, problem: str = "") -> CacheOutcome:
    """Before vLLM reads ``subject``: ``load`` a verified cache, ``compile`` over an empty one,
    else ``quarantined``. ``keyring`` None means trusted keys are configured but unusable
    (``problem`` says why): nothing is trusted then. Raises ``StoreError`` only if the directory
    cannot be moved aside (the caller must then keep vLLM from reading it)."""
    directory = root.directory(subject)
    with cachedir.locked(directory):
        if not _has_files(directory):
            return CacheOutcome(subject, "compile", "no-cache", "no compile cache yet")
        try:
            if keyring is None:
                raise Rejected(Reason.CONFIG, f"trusted keys unusable ({problem})")
            return _outcome(subject, "load", verify_directory(root, subject, keyring, now))
        except (Rejected, StoreError) as exc:
            target = cachedir.quarantine(directory, root.quarantine_root, exc.reason.value)
            return CacheOutcome(subject, "quarantined", exc.reason.value, exc.detail, quarantined_to=str(target))


def build_manifest(directory: Path, subject: str, now: datetime, expires_at: datetime | None, comment: str) -> tuple[Manifest, bytes]:
    """The manifest of a directory as it is now, and its deterministic archive."""
    listing = cachedir.walk(directory)
    dirs = tuple(sorted(p for p, size in listing.items() if size is None))
    sums = cachedir.digests(directory, listing)
    files = tuple(FileEntry(p, size, sums[p]) for p, size in sorted(listing.items()) if size is not None)
    data = cachedir.archive_bytes(directory, files, dirs)
    manifest = Manifest(subject, files, dirs, hashlib.sha256(data).hexdigest(), len(data), now, expires_at, comment)
    return manifest, data


def sign_cache(
    root: CacheRoot, subject: str, signer: Signer, now: datetime, expires_in: timedelta | None = None, comment: str = ""
) -> CacheOutcome:
    """Sign the directory as it is (this signer alone) and write the sidecar beside it atomically.
    Signing vouches for bytes this process did not check: run it only where the cache was built."""
    directory = root.directory(subject)
    with cachedir.locked(directory):
        if directory.is_symlink() or not directory.is_dir():
            raise Rejected(Reason.MALFORMED, f"{directory} is not a plain directory")
        manifest, _ = build_manifest(directory, subject, now, now + expires_in if expires_in else None, comment)
        sig = sign_manifest(manifest, signer)
        verified = verify_manifest(subject, sig, signer_keyring(signer), now)
        write_atomic(cachedir.sidecar_path(directory), sig)
    return _outcome(subject, "signed", verified)


def push_cache(store: Store, root: CacheRoot, subject: str, keyring: Keyring, now: datetime, deadline: float | None = None) -> CacheOutcome:
    """Upload a cache that verifies under ``keyring``: its archive, then its signature."""
    directory = root.directory(subject)
    with cachedir.locked(directory):
        verified = verify_directory(root, subject, keyring, now)
        m = verified.manifest
        data = cachedir.archive_bytes(directory, m.files, m.dirs)
    if hashlib.sha256(data).hexdigest() != m.archive_sha256 or len(data) != m.archive_size:
        raise Rejected(Reason.DIGEST_MISMATCH, "the rebuilt archive differs from the signed one (another tar writer?); sign again")
    archives.put_object(store, archives.archive_name(subject), data, deadline)
    archives.put_object(store, archives.sig_name(subject), verified.sig_bytes, deadline)
    return _outcome(subject, "pushed", verified)


def pull_cache(store: Store, root: CacheRoot, subject: str, keyring: Keyring, now: datetime, deadline: float | None = None) -> CacheOutcome:
    """Signature GET -> verify -> archive GET capped at the signed size -> sha256 -> extract into a
    temporary directory -> closed world and every sha256 -> rename into place (under the lock)."""
    directory = root.directory(subject)
    sig = archives.get_object(store, archives.sig_name(subject), MAX_SIG_BYTES, deadline)
    if sig is None:
        raise Rejected(Reason.UNSIGNED, f"no signed compile cache {subject} in {store.url}")
    verified = verify_manifest(subject, sig, keyring, now)
    m = verified.manifest
    with cachedir.locked(directory):
        try:
            if verify_directory(root, subject, keyring, now).manifest == m:
                return _outcome(subject, "kept", verified, "already present and verified")
        except PlanCacheError:
            pass
    data = archives.get_object(store, archives.archive_name(subject), m.archive_size, deadline)
    if data is None:
        raise StoreError(f"the archive of {subject} is missing from {store.url}")
    if len(data) != m.archive_size or hashlib.sha256(data).hexdigest() != m.archive_sha256:
        raise Rejected(Reason.DIGEST_MISMATCH, "the archive does not match its signed sha256 (altered?)")
    directory.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=".plancache-pull-", dir=directory.parent))
    try:
        cachedir.extract_archive(data, m, staged / "x")
        _check_tree(staged / "x", verified)
        with cachedir.locked(directory):
            cachedir.install(staged / "x", directory, sig, root.quarantine_root)
    except OSError as exc:
        raise StoreError(f"cannot extract into {directory.parent}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return _outcome(subject, "pulled", verified)

