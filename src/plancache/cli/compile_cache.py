"""``plancache compile-cache sign|verify|ls [ROOT]``, ``push [ROOT] [URL]``, ``pull [URL] [ROOT]``.

ROOT is vLLM's cache root, resolved as vLLM does (``$VLLM_CACHE_ROOT``, else
``$XDG_CACHE_HOME/vllm``, else ``~/.cache/vllm``); the caches are the directories under
``ROOT/torch_compile_cache/`` (``torch_aot_compile/<64 hex>`` and ``<10 hex>``), ``--cache``
picks some. A ROOT that does not exist is a configuration error (exit 2) except for ``pull``,
which fills a fresh node. The store URL is the positional URL, ``--url`` or ``$PLANCACHE_URL``,
with the positionals in the order of ``plancache push [DIR] URL`` / ``plancache pull URL [DIR]``
(a lone positional is the URL when it has a scheme, ``s3://…``, else ROOT).

vLLM's debug dump is shown as what it is: with the AOT layout, ``VllmBackend`` still makes a
``<10 hex>`` directory beside ``torch_aot_compile/`` and writes only ``computation_graph.py``
(a readable dump of the split graph) and ``cache_key_factors.json`` (the hash factors) under
``rank_<r>_<dp>/<prefix>/``; vLLM 0.33 never reads either (it only checks that they exist
before writing), and without ``vllm_compile_cache.py`` there it loads no artifact from that
directory. The plugin signs only what vLLM loads, so that directory is unsigned: ``verify``,
``ls`` and ``push`` report it as ``debug`` (ok, not pushed) instead of a rejected cache. Any
other file in it, or a sidecar beside it, makes it an ordinary cache again. The guard at boot
is unchanged: it still verifies the directory before vLLM's ``initialize_cache`` reads it.

Thin commands over :mod:`plancache.pipeline.compile_cache.flows` (and ``local_caches`` for
``verify`` and ``ls``); exit codes as ``verify``: 0 every cache fine; 1 a cache was rejected; 2
usage, configuration or store error. ``sign``, ``push`` and ``pull`` wait for each cache's node lock
at most ``--timeout`` (default 120 s); a wait that runs out, or a lock that cannot be taken safely,
is that cache's error row, one line on stderr and exit 2: the command never works on a cache
unlocked.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..clock import Deadline
from ..pipeline.compile_cache import flows
from ..pipeline.compile_cache.local_caches import (
    CacheOutcome,
    CacheRoot,
    describe_cache,
    verify_cache,
)
from ..pipeline.locations import BULK_TIMEOUT, require_push_target
from ..pipeline.resolver import utcnow
from ..settings import URL_ENV
from ..storage.compile_cache import archives, cachedir
from ..storage.local import directory_lock
from ..storage.local.localdir import vllm_cache_root
from ..storage.store import Store, open_store
from ..trust.display import safe_text
from ..trust.errors import ConfigError, PlanCacheError, Reason, Rejected
from ..trust.keyring.keys import Keyring, signer_keyring
from .flag_objects import required_policy, required_signer, storage_options
from .output import print_table, report

EXIT_REJECTED, EXIT_CONFIG = 1, 2
HEADERS = ("cache", "action", "files", "MiB", "signers", "reason", "detail")
DEBUG_DETAIL = (
    "vLLM's debug dump beside the AOT cache (computation_graph.py, cache_key_factors.json): "
    "vLLM never reads it; unsigned, not pushed, still guarded at boot"
)
STOPPED = frozenset({Reason.TIMEOUT, Reason.LOCK_UNAVAILABLE, Reason.UNSAFE_DIRECTORY})
"""Reasons that also get one line on stderr: a wait that ran out or a lock that cannot be taken
safely is the node's state, not the cache's, and a script reading only stderr must see it. So
does ``private-data`` (a push refused: the variable and file named, never the value)."""


def _places(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(ROOT, URL) from the positionals, in ``push [ROOT] [URL]`` / ``pull [URL] [ROOT]`` order;
    a lone positional is the URL when it names a scheme. ``--url`` must agree with a positional
    URL."""
    command = args.compile_command
    if command not in ("push", "pull"):
        return args.root, None
    first, second = (args.root, args.target) if command == "push" else (args.source, args.root)
    root = url = None
    if second is not None:
        root, url = (first, second) if command == "push" else (second, first)
        if "://" not in url:
            raise ConfigError(
                f"'{safe_text(url, 200)}' is not a store URL (e.g. s3://bucket/prefix)"
            )
    elif first is not None:
        url, root = (first, None) if "://" in first else (None, first)
    if args.url and url and args.url != url:
        raise ConfigError("two different store URLs: give it once, as URL or as --url")
    return root, url or args.url


def _root(args: argparse.Namespace, must_exist: bool = True) -> CacheRoot:
    given = _places(args)[0]
    root = CacheRoot(Path(os.path.expanduser(given)) if given else vllm_cache_root())
    if must_exist and not root.root.is_dir():
        what = "does not exist" if not os.path.lexists(root.root) else "is not a directory"
        where = "" if given else " (the default root: $VLLM_CACHE_ROOT, else ~/.cache/vllm)"
        raise ConfigError(f"compile-cache root {safe_text(str(root.root), 300)} {what}{where}")
    return root


def _debug_dump(root: CacheRoot, subject: str) -> CacheOutcome | None:
    """A ``debug`` row when ``subject`` is vLLM's unsigned debug dump (see the module docstring)."""
    if "/" in subject:
        return None
    directory = root.directory(subject)
    if os.path.lexists(cachedir.sidecar_path(directory)):
        return None
    try:
        listing = cachedir.walk(directory)
    except PlanCacheError:
        return None
    files = {path: size for path, size in listing.items() if size is not None}
    if not files or any(
        not p.startswith("rank_") or p.rsplit("/", 1)[-1] not in cachedir.DEBUG_FILES for p in files
    ):
        return None
    return CacheOutcome(subject, "debug", "", DEBUG_DETAIL, len(files), sum(files.values()))


def _subjects(args: argparse.Namespace, found: list[str]) -> list[str]:
    return list(dict.fromkeys(args.cache)) if args.cache else found


def _keyring(args: argparse.Namespace) -> Keyring:
    keyring = required_policy(args).keyring
    assert keyring is not None  # required_policy raises rather than return an unsigned policy
    return keyring


def _store(args: argparse.Namespace) -> Store:
    url = _places(args)[1] or os.environ.get(URL_ENV)
    if not url or "://" not in url:
        raise ConfigError(f"no store URL: pass URL (or --url) s3://bucket/prefix, or set {URL_ENV}")
    return open_store(
        url, storage_options(args), timeout=BULK_TIMEOUT if args.timeout is None else args.timeout
    )


def _each(
    subjects: list[str],
    flow: Callable[[str], CacheOutcome],
    root: CacheRoot | None = None,
) -> list[CacheOutcome]:
    """Run ``flow`` per cache; a rejection is a row, a store error a row that makes exit 2.
    With ``root``, vLLM's debug dump is a ``debug`` row and ``flow`` does not run on it."""
    outcomes = []
    for subject in subjects:
        try:
            dump = _debug_dump(root, subject) if root is not None else None
            outcomes.append(dump or flow(subject))
        except PlanCacheError as exc:
            if (
                exc.reason in STOPPED and not isinstance(exc, Rejected)
            ) or exc.reason is Reason.PRIVATE_DATA:
                print(
                    f"plancache: error: {safe_text(subject, 200)}: {exc.reason.value}: "
                    f"{safe_text(exc.detail, 500)}",
                    file=sys.stderr,
                )
            outcomes.append(
                CacheOutcome(
                    subject,
                    "rejected" if isinstance(exc, Rejected) else "error",
                    exc.reason.value,
                    exc.detail,
                )
            )
    return outcomes


def _report(args: argparse.Namespace, outcomes: list[CacheOutcome], listing: bool = False) -> int:
    """Print the rows (or the JSON report) and return the exit code; ``ls`` without keys only
    describes, so an unverified cache is no failure there."""
    code = (
        EXIT_CONFIG
        if any(o.action == "error" for o in outcomes)
        else (EXIT_REJECTED if not listing and any(not o.ok for o in outcomes) else 0)
    )
    if args.json:
        report(
            args,
            code == 0,
            action=args.compile_command,
            caches=[
                {
                    "cache": o.subject,
                    "action": o.action,
                    "ok": o.ok and o.action != "error",
                    "reason": o.reason or None,
                    "detail": o.detail or None,
                    "files": o.files,
                    "bytes": o.size,
                    "signers": list(o.signers),
                    "signed_by": list(o.signed_by),
                    "keyless": list(o.keyless),
                }
                for o in outcomes
            ],
        )
    else:
        print_table(
            [
                (
                    o.subject,
                    o.action,
                    o.files or "",
                    f"{o.size / 2**20:.1f}" if o.size else "",
                    ", ".join(o.signers),
                    o.reason,
                    o.detail,
                )
                for o in outcomes
            ],
            HEADERS,
        )
    return code


def cmd_sign(args: argparse.Namespace) -> int:
    root, signer, now = _root(args), required_signer(args), utcnow()
    wait = directory_lock.LOCK_WAIT if args.timeout is None else args.timeout
    return _report(
        args,
        _each(
            _subjects(args, root.subjects()),
            lambda s: flows.sign_cache(
                root, s, signer, now, expires_in=args.expires_in, comment=args.comment, wait=wait
            ),
        ),
    )


def cmd_verify(args: argparse.Namespace) -> int:
    root, keyring, now = _root(args), _keyring(args), utcnow()
    return _report(
        args,
        _each(
            _subjects(args, root.subjects()),
            lambda s: verify_cache(root, s, keyring, now),
            root,
        ),
    )


def cmd_ls(args: argparse.Namespace) -> int:
    root = _root(args)
    if args.trusted_keys or os.environ.get("PLANCACHE_TRUSTED_KEYS"):
        return cmd_verify(args)

    outcomes = _each(_subjects(args, root.subjects()), lambda s: describe_cache(root, s), root)
    return _report(args, outcomes, listing=True)


def cmd_push(args: argparse.Namespace) -> int:
    root, now = _root(args), utcnow()
    keyring = signer_keyring(required_signer(args)) if args.key else _keyring(args)
    store = _store(args)
    require_push_target(store)
    deadline = Deadline.after(store.timeout, store.clock)
    return _report(
        args,
        _each(
            _subjects(args, root.subjects()),
            lambda s: flows.push_cache(
                store, root, s, keyring, now, deadline=deadline, wait=store.timeout
            ),
            root,
        ),
    )


def cmd_pull(args: argparse.Namespace) -> int:
    root, keyring, now = _root(args, must_exist=False), _keyring(args), utcnow()
    store = _store(args)
    deadline = Deadline.after(store.timeout, store.clock)
    subjects = _subjects(args, archives.list_subjects(store, deadline) if not args.cache else [])

    def pull(subject: str) -> CacheOutcome:
        outcome = flows.pull_cache(
            store, root, subject, keyring, now, deadline=deadline, wait=store.timeout
        )
        return (
            _with_headers(outcome, store, root, keyring)
            if outcome.action in ("pulled", "kept")
            else outcome
        )

    return _report(args, _each(subjects, pull))


def _with_headers(
    outcome: CacheOutcome, store: Store, root: CacheRoot, keyring: Keyring
) -> CacheOutcome:
    """A pulled (or kept) cache's precompiled headers into the node's private headers directory,
    within their own budget; what happened is noted in the row's detail (torch builds what is
    not installed, so it is never a failure of the pull). Bound to the cache now on disk: a pull
    that kept a newer local cache names that one, so the store's older header is refused."""
    from ..pipeline.compile_cache.header_shipping import pull_headers
    from ..settings import HEADERS_TIMEOUT
    from ..storage.compile_cache.boot_dirs import private_root
    from ..storage.compile_cache.header_files import HEADERS_SUBDIR
    from ..trust.errors import StoreError

    try:  # where this user's workers on this node keep them (PLANCACHE_PRIVATE_DIR included)
        private = private_root(root.root)
    except StoreError as exc:
        note = f"headers: none (no private directory: {exc.detail})"
        return replace(outcome, detail=f"{outcome.detail}; {note}" if outcome.detail else note)
    got = pull_headers(
        store,
        outcome.subject,
        keyring,
        utcnow(),
        private.parent,
        private / HEADERS_SUBDIR,
        cache_archive_sha256=outcome.archive_sha256 or None,
        deadline=Deadline.after(max(store.timeout, HEADERS_TIMEOUT), store.clock),
    )
    note = (
        f"headers: {got.action}"
        + (f" {len(got.installed)} ({got.size} bytes)" if got.installed else "")
        + (
            f" ({got.reason}: {got.detail})"
            if got.reason
            else f" ({got.detail})"
            if got.detail
            else ""
        )
    )
    return replace(outcome, detail=f"{outcome.detail}; {note}" if outcome.detail else note)
