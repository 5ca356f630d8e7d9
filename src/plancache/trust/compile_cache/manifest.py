"""The signed manifest of one vLLM compile-cache directory: what it says, its rules, its bytes.

A compile cache is code (pickles that ``pickle.load`` runs, generated ``.py`` that inductor
``exec``s, ``.so`` it ``dlopen``s), so the signature must cover every byte *and* every name:

- the statement's one subject is the directory's name under ``torch_compile_cache/``
  (``torch_aot_compile/<64 hex>`` or the ``VLLM_USE_AOT_COMPILE=0`` layout's ``<10 hex>``): that
  name is vLLM's hash of model, config and environment, so a cache signed for one
  configuration and renamed into another's directory fails (``name-mismatch``);
- the predicate lists every file (relative path, size, sha256) and every directory: the
  directory is a *closed world*, because torch uses whatever lies there (an extra pickle in
  ``fxgraph/`` is read on a recompile) even if every listed file is intact;
- it also binds the sha256 and size of the one archive a store holds for this directory, so
  ``pull`` can check the archive before a byte of it is extracted.

- optionally (issue 20) vLLM's cache-key factors in the clear (``key_factors``: what vLLM writes
  to ``cache_key_factors.json``) and what the build measured (``measurements.compile_ms``), so a
  node that misses, or loads and compiles anyway, can be told which factor differs and what a
  load saved. Manifests without them are written byte-for-byte as before and still verify.
  Since issue 40 the factors' values are keyed hashes but for an allow-list of compile settings
  (:func:`plancache.trust.inputs.keyed_factors`), under a random salt signed inside them
  (:attr:`Manifest.factors_salt`): older factors, values in the clear, still verify and compare.

This module is the manifest as a value: its caps and names, its structural rules, its statement
bytes both ways. Signing and verifying them is :mod:`.manifest_signature`'s (the envelope, the
trusted keys); comparing one with a directory is :mod:`.closed_world`'s. No IO here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeGuard

from ..display import safe_text
from ..errors import Reason, Rejected
from ..inputs import SALT_KEY, check_inputs, salt_of
from ..statement import format_time, parse_time, render_statement, statement_shell

PREDICATE_TYPE = "https://plancache.dev/compile-cache/v1"

MAX_FILES = 50_000
MAX_DIRS = 50_000
MAX_FILE_BYTES = 4 * 2**30
MAX_TOTAL_BYTES = 16 * 2**30
"""Real caches are tens to hundreds of MiB (thousands of files with Triton kernels); the caps
bound what a hostile directory or archive can make a verifier read, hash or extract."""
MAX_PATH = 1024
MAX_DEPTH = 32

_HEX64 = re.compile(r"[0-9a-f]{64}")
_SUBJECT = re.compile(r"torch_aot_compile/[0-9a-f]{64}|[0-9a-f]{10}")
_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+=-]{0,254}")
"""Names torch and vLLM write (hex, base32, ``rank_0_0``, ``c…main.cpp``); no leading dot, so
never ``.`` or ``..``, no separators, no controls."""

OPTIONAL_KEYS = frozenset({"key_factors", "measurements"})
"""Predicate keys a manifest may carry (issue 20). Versions before it reject a manifest with
them (their predicate had exactly six keys): upgrade the nodes that load before the builders."""


def is_subject(name: object) -> TypeGuard[str]:
    """``torch_aot_compile/<64 hex>`` (AOT layout) or ``<10 hex>`` (``VLLM_USE_AOT_COMPILE=0``)."""
    return isinstance(name, str) and _SUBJECT.fullmatch(name) is not None


def check_relpath(path: object) -> str:
    """A relative path inside a cache directory: no absolute path, no ``.``/``..``, no empty
    component, no backslash or control, bounded length and depth.

    Raises:
        Rejected: ``path`` is no such path (reason ``malformed``).
    """
    if not isinstance(path, str) or not path or len(path) > MAX_PATH:
        raise Rejected(Reason.MALFORMED, f"cache path {safe_text(path, 80)!s} is empty or too long")
    parts = path.split("/")
    if len(parts) > MAX_DEPTH or not all(_COMPONENT.fullmatch(p) for p in parts):
        raise Rejected(
            Reason.MALFORMED, f"cache path '{safe_text(path, 120)}' is not a plain relative path"
        )
    return path


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """What a signature says about one cache directory."""

    subject: str
    files: tuple[FileEntry, ...]
    dirs: tuple[str, ...]
    archive_sha256: str
    archive_size: int
    signed_at: datetime
    expires_at: datetime | None = None
    comment: str = ""
    key_factors: Mapping[str, Any] | None = None
    """vLLM's cache-key factors (``cache_key_factors.json``) as signed: values keyed but for an
    allow-list (:func:`plancache.trust.inputs.keyed_factors`); None: not recorded."""
    measurements: Mapping[str, Any] | None = None
    """``compile_ms``: how long the build boot compiled; None: not measured."""

    @property
    def factors_salt(self) -> str | None:
        """The salt the factors' values are keyed with (``key_factors["hmac_salt"]``), so that a
        node holding a value can compare it; None: factors signed before issue 40, or none."""
        return salt_of(self.key_factors)

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def to_json_bytes(self) -> bytes:
        predicate = {
            "archive": {"sha256": self.archive_sha256, "size": self.archive_size},
            "comment": self.comment,
            "dirs": list(self.dirs),
            "expires_at": format_time(self.expires_at) if self.expires_at else None,
            "files": [[f.path, f.size, f.sha256] for f in self.files],
            "signed_at": format_time(self.signed_at),
        }
        if self.key_factors is not None:
            predicate["key_factors"] = dict(self.key_factors)
        if self.measurements:
            predicate["measurements"] = dict(self.measurements)
        return render_statement(
            self.subject,
            sha256=self.archive_sha256,
            predicate_type=PREDICATE_TYPE,
            predicate=predicate,
        )


def _int(value: object, what: str, cap: int) -> int:
    if type(value) is not int or not 0 <= value <= cap:
        raise Rejected(Reason.MALFORMED, f"manifest: {what} is not a whole number in 0…{cap}")
    return value


def check_manifest(manifest: Manifest) -> Manifest:
    """The structural rules every manifest obeys, for signing and verifying alike: caps, plain
    paths, sorted unique entries, every file's parent listed as a directory.

    Raises:
        Rejected: ``malformed`` (a subject that is no cache directory name, a path, size or
            sha256 off its form, entries not sorted and unique, a parent not listed, key factors
            or measurements off their form), ``too-large`` (more than :data:`MAX_FILES` files or
            :data:`MAX_DIRS` directories, more than :data:`MAX_TOTAL_BYTES` in all, key factors
            over their caps).
    """
    if not is_subject(manifest.subject):
        raise Rejected(
            Reason.MALFORMED,
            f"manifest subject '{safe_text(manifest.subject, 100)}' is not a cache directory name",
        )
    if len(manifest.files) > MAX_FILES or len(manifest.dirs) > MAX_DIRS:
        raise Rejected(
            Reason.TOO_LARGE,
            f"manifest lists more than {MAX_FILES} files or {MAX_DIRS} directories",
        )
    if not _HEX64.fullmatch(manifest.archive_sha256):
        raise Rejected(
            Reason.MALFORMED, "manifest: the archive sha256 is not 64 lowercase hex digits"
        )
    dirs = set(map(check_relpath, manifest.dirs))
    paths = [check_relpath(f.path) for f in manifest.files]
    if list(manifest.dirs) != sorted(dirs) or paths != sorted(set(paths)) or dirs & set(paths):
        raise Rejected(Reason.MALFORMED, "manifest entries are not sorted and unique")
    for entry in manifest.files:
        _int(entry.size, "a file size", MAX_FILE_BYTES)
        if not _HEX64.fullmatch(entry.sha256):
            raise Rejected(
                Reason.MALFORMED, "manifest: a file sha256 is not 64 lowercase hex digits"
            )
    for path in paths + sorted(dirs):
        parent = path.rpartition("/")[0]
        if parent and parent not in dirs:
            raise Rejected(
                Reason.MALFORMED, f"manifest: the parent of '{safe_text(path, 120)}' is not listed"
            )
    if manifest.total_size > MAX_TOTAL_BYTES:
        raise Rejected(
            Reason.TOO_LARGE,
            f"manifest totals {manifest.total_size} bytes, the cap is {MAX_TOTAL_BYTES}",
        )
    _int(
        manifest.archive_size,
        "the archive size",
        MAX_TOTAL_BYTES + 512 * (MAX_FILES + MAX_DIRS) * 4,
    )
    if manifest.key_factors is not None:
        check_inputs(dict(manifest.key_factors), "manifest key_factors")
        if SALT_KEY in manifest.key_factors and manifest.factors_salt is None:
            raise Rejected(
                Reason.MALFORMED, f"manifest key_factors: {SALT_KEY} is not 32 lowercase hex digits"
            )
    if manifest.measurements:
        check_measurements(dict(manifest.measurements))
    return manifest


def parse_manifest(payload: bytes) -> Manifest:
    """Parse a (signature-verified) statement strictly: exact keys, exact types.

    Raises:
        Rejected: ``malformed`` (any deviation from the schema, or :func:`check_manifest`'s
            rules), ``too-large`` (more entries than the caps allow).
    """
    name, sha256, pred = statement_shell(
        payload, "manifest statement", predicate_type=PREDICATE_TYPE
    )
    keys = {"archive", "comment", "dirs", "expires_at", "files", "signed_at"}
    if not keys <= set(pred) <= keys | OPTIONAL_KEYS:
        raise Rejected(
            Reason.MALFORMED,
            f"manifest predicate must have exactly {', '.join(sorted(keys))} "
            f"(and optionally {', '.join(sorted(OPTIONAL_KEYS))})",
        )
    archive, files, dirs = pred["archive"], pred["files"], pred["dirs"]
    if (
        not isinstance(archive, dict)
        or set(archive) != {"sha256", "size"}
        or not isinstance(archive["sha256"], str)
    ):
        raise Rejected(Reason.MALFORMED, "manifest archive must have exactly sha256 and size")
    if archive["sha256"] != sha256:
        raise Rejected(Reason.MALFORMED, "manifest subject digest differs from the archive's")
    if (
        not isinstance(files, list)
        or not isinstance(dirs, list)
        or not isinstance(pred["comment"], str)
    ):
        raise Rejected(Reason.MALFORMED, "manifest files, dirs or comment have the wrong type")
    if len(files) > MAX_FILES or len(dirs) > MAX_DIRS:
        raise Rejected(
            Reason.TOO_LARGE,
            f"manifest lists more than {MAX_FILES} files or {MAX_DIRS} directories",
        )
    entries = []
    for item in files:
        if not (
            isinstance(item, list)
            and len(item) == 3
            and isinstance(item[0], str)
            and isinstance(item[2], str)
        ):
            raise Rejected(Reason.MALFORMED, "manifest: each file is [path, size, sha256]")
        entries.append(FileEntry(item[0], _int(item[1], "a file size", MAX_FILE_BYTES), item[2]))
    if not all(isinstance(d, str) for d in dirs):
        raise Rejected(Reason.MALFORMED, "manifest: each directory is a path")
    expires = pred["expires_at"]
    return check_manifest(
        Manifest(
            subject=name,
            files=tuple(entries),
            dirs=tuple(dirs),
            archive_sha256=archive["sha256"],
            archive_size=_int(archive["size"], "the archive size", 2**62),
            signed_at=parse_time(pred["signed_at"], "signed_at"),
            expires_at=None if expires is None else parse_time(expires, "expires_at"),
            comment=pred["comment"],
            key_factors=None
            if "key_factors" not in pred
            else check_inputs(pred["key_factors"], "manifest key_factors"),
            measurements=None
            if "measurements" not in pred
            else check_measurements(pred["measurements"]),
        )
    )


def check_measurements(measurements: object) -> dict[str, Any]:
    """``{"compile_ms": <finite, non-negative number>}``; names it does not know are dropped.

    Raises:
        Rejected: not an object, or a ``compile_ms`` that is no finite, non-negative number
            (reason ``malformed``).
    """
    if not isinstance(measurements, dict):
        raise Rejected(Reason.MALFORMED, "manifest measurements is not an object")
    out = {}
    for key, value in measurements.items():
        if key != "compile_ms":
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not 0 <= value < float("inf")
        ):
            raise Rejected(
                Reason.MALFORMED,
                f"manifest measurement '{key}' is not a finite, non-negative number",
            )
        out[key] = value
    return out
