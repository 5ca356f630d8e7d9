"""The compile-cache flows that write: sign in place, publish a build node's private copy, push
to a store, pull from one.

Each runs under the node's lock for the cache and verifies before it writes (the reads are in
:mod:`.local_caches`, the manifests built in :mod:`.manifest_building`). No flow parses a byte
of the cache; torch does, after :func:`plancache.pipeline.compile_cache.load.guard` said
``load``, and then only from the private copy it made.

A pull never replaces a local cache that verifies and was signed at the same time or later
(no rollback by a bucket writer); a cache a build node compiled in private is signed as hashed
there and those bytes put in place by :func:`publish_cache`. Every file written goes through
descriptors (:mod:`plancache.storage.local.dirfds`): no write follows a link.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ...clock import Deadline
from ...storage.compile_cache import archive_format, archives, cachedir, placement
from ...storage.compile_cache.boot_dirs import PRIVATE_DIR_ENV
from ...storage.local import directory_lock, dirfds
from ...storage.store import Store
from ...trust.compile_cache.manifest import Manifest
from ...trust.compile_cache.manifest_signature import (
    MAX_SIG_OBJECT_BYTES,
    sign_manifest,
    verify_manifest,
)
from ...trust.errors import PlanCacheError, Reason, Rejected, StoreError
from ...trust.keyring.keys import Keyring, Signer, signer_keyring
from ...trust.statement import format_time
from ..directory_signing import signing_moment
from . import shipping_check
from .local_caches import (
    CacheOutcome,
    CacheRoot,
    check_tree,
    has_files,
    outcome_of,
    verify_directory,
)
from .manifest_building import build_manifest


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
        moment = signing_moment(signer, now)  # keyless: after the lock's wait, not before it
        return _sign_locked(root, subject, signer, moment, expires_in, comment)


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
            lambda staged: check_tree(staged, verified),
            "publish",
        )
    return outcome_of(subject, "signed", verified, detail=aside)


def push_cache(
    store: Store,
    root: CacheRoot,
    subject: str,
    keyring: Keyring,
    now: datetime,
    *,
    deadline: Deadline | None = None,
    wait: float = directory_lock.LOCK_WAIT,
) -> CacheOutcome:
    """Upload a cache that verifies under ``keyring``: its archive, then its signature.

    Nothing is uploaded when a file of the archive carries a secret or private path of this node
    (:mod:`.shipping_check`).

    Raises:
        Rejected: the cache does not verify (:func:`.local_caches.verify_directory`), the
            archive rebuilt from it differs from the signed one (``digest-mismatch``), or it
            carries something private (``private-data``: the variable and file named).
    """
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
    shipping_check.check_archive(data, shipping_check.this_node(allowed_paths(root)))
    archives.put_object(store, archives.archive_name(subject), data, deadline=deadline)
    archives.put_object(store, archives.sig_name(subject), verified.sig_bytes, deadline=deadline)
    detail = f"{m.archive_size} bytes, {len(m.files)} files"
    return outcome_of(subject, "pushed", verified, detail=detail)


def allowed_paths(root: CacheRoot) -> list[Path]:
    """The paths a compiled file of ``root`` carries by design, shipped: the cache root, and the
    operator's private directory (``$PLANCACHE_PRIVATE_DIR``), where vLLM compiled them."""
    private = os.environ.get(PRIVATE_DIR_ENV, "")
    return [root.root] + ([Path(private)] if private else [])


def pull_cache(
    store: Store,
    root: CacheRoot,
    subject: str,
    keyring: Keyring,
    now: datetime,
    *,
    deadline: Deadline | None = None,
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
    deadline: Deadline | None,
    *,
    read_signature: Callable[[], bytes | None] | None = None,
) -> CacheOutcome:
    """Signature GET (``read_signature``'s, when the caller read it already: the guard's
    back-off looked at it first, and the same bytes are verified) -> verify -> (a local cache
    that verifies and was signed at the same time or later is kept: no rollback) -> archive GET
    capped at the signed size -> sha256 -> extract into a staging directory beside the target
    -> closed world and every sha256 -> rename
    (:mod:`~plancache.storage.compile_cache.placement`). A lone sidecar is moved aside first.
    From a registry with a ``subject``, a cache whose signature or archive is rejected is tried
    from the other signed caches attached to the image, newest first (the plan readers' step:
    :mod:`~plancache.storage.oci.candidate_reads`): a co-tenant's referrer whose signature does
    not verify cannot hide the signed cache; none verifying raises the first rejection.

    Raises:
        Rejected: the store holds no signature for ``subject`` (``unsigned``), the signature does
            not verify, or the archive does not match its signed size and sha256
            (``digest-mismatch``).
        StoreError: the signature is there but the archive is missing (``store-error``).
    """
    directory = root.directory(subject)
    aside = placement.set_aside_lone_sidecar(root.root, directory, root.quarantine_root)
    sig = (
        read_signature()
        if read_signature is not None
        else archives.get_object(
            store, archives.sig_name(subject), MAX_SIG_OBJECT_BYTES, deadline=deadline
        )
    )
    if sig is None:
        raise Rejected(Reason.UNSIGNED, f"no signed compile cache {subject} in {store.url}")

    def archive(cap: int) -> bytes | None:
        return archives.get_object(store, archives.archive_name(subject), cap, deadline=deadline)

    try:
        return _install(store, root, subject, keyring, now, sig, archive, aside)
    except Rejected as exc:
        first = exc
    for other_sig, other_archive in _other_candidates(store, subject, deadline):
        try:
            pulled = _install(store, root, subject, keyring, now, other_sig, other_archive, aside)
        except Rejected:
            continue
        note = (
            f"the newest compile cache attached to the image was rejected ({first.reason.value}: "
            f"{first.detail}); an older one verified"
        )
        return replace(pulled, detail="; ".join(d for d in (aside, note) if d))
    raise first


def _other_candidates(
    store: Store, subject: str, deadline: Deadline | None
) -> list[tuple[bytes, Callable[[int], bytes | None]]]:
    """(signature, archive reader) of each other signed cache attached to the store's image
    (``--subject``: :func:`...storage.oci.candidate_reads.other_candidates`, the plan readers'
    own step), newest first; none for any other store or when the registry cannot say."""
    if store.subject is None:  # only a registry's image has other candidates
        return []
    from ...storage.oci.candidate_reads import Candidate, candidate_content, other_candidates

    try:
        found = other_candidates(
            store, archives.archive_name(subject), MAX_SIG_OBJECT_BYTES, deadline=deadline
        )
    except PlanCacheError:
        return []

    def reader(candidate: Candidate) -> Callable[[int], bytes | None]:
        return lambda cap: candidate_content(store, candidate, cap, deadline=deadline)

    return [(c.signature, reader(c)) for c in found]


def _install(
    store: Store,
    root: CacheRoot,
    subject: str,
    keyring: Keyring,
    now: datetime,
    sig: bytes,
    archive: Callable[[int], bytes | None],
    aside: str,
) -> CacheOutcome:
    """One candidate's signature verified, then its archive read capped at the signed size,
    hashed and installed (:func:`pull_locked`'s steps after the signature's read)."""
    directory = root.directory(subject)
    verified = verify_manifest(subject, sig, keyring, now)
    m = verified.manifest
    kept = _kept_local(root, subject, keyring, now, m)
    if kept is not None:
        return kept
    data = archive(m.archive_size)
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
        lambda staged: check_tree(staged, verified),
        "pull",
    )
    return outcome_of(subject, "pulled", verified, detail=aside)


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
        return outcome_of(subject, "kept", local, detail="already present and verified")
    if local.manifest.signed_at >= offered.signed_at:
        return outcome_of(
            subject,
            "kept",
            local,
            detail="the local cache verifies and was signed "
            f"{format_time(local.manifest.signed_at)}, the store's "
            f"{format_time(offered.signed_at)}: not replaced by an older one",
        )
    return None
