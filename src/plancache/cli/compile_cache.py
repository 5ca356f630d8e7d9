"""``plancache compile-cache sign|verify|ls|push|pull [ROOT]``: vLLM's torch.compile cache.

ROOT is vLLM's cache root, resolved as vLLM does (``$VLLM_CACHE_ROOT``, else
``$XDG_CACHE_HOME/vllm``, else ``~/.cache/vllm``); the caches are the directories under
``ROOT/torch_compile_cache/`` (``torch_aot_compile/<64 hex>`` and ``<10 hex>``), ``--cache``
picks some. Thin commands over :mod:`plancache.pipeline.compile_cache`; exit codes as
``verify``: 0 every cache fine; 1 a cache was rejected; 2 usage, configuration or store error.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Callable

from ..pipeline import compile_cache as flows
from ..pipeline.locations import BULK_TIMEOUT
from ..pipeline.resolver import utcnow
from ..storage import archives
from ..storage.localdir import vllm_cache_root
from ..storage.store import Store, open_store
from ..trust.errors import ConfigError, PlanCacheError, Rejected
from ..trust.keys import Keyring, signer_keyring
from .inputs import required_policy, required_signer, storage_options
from .output import print_table, report

EXIT_REJECTED, EXIT_CONFIG = 1, 2
HEADERS = ("cache", "action", "files", "MiB", "signers", "reason", "detail")


def _root(args: argparse.Namespace) -> flows.CacheRoot:
    return flows.CacheRoot(Path(os.path.expanduser(args.root)) if args.root else vllm_cache_root())


def _subjects(args: argparse.Namespace, found: list[str]) -> list[str]:
    return list(dict.fromkeys(args.cache)) if args.cache else found


def _keyring(args: argparse.Namespace) -> Keyring:
    keyring = required_policy(args).keyring
    assert keyring is not None  # required_policy raises rather than return an unsigned policy
    return keyring


def _store(args: argparse.Namespace) -> Store:
    url = args.url or os.environ.get(URL_ENV)
    if not url or "://" not in url:
        raise ConfigError(f"no store URL: pass --url s3://bucket/prefix or set {URL_ENV}")
    return open_store(url, storage_options(args), timeout=BULK_TIMEOUT if args.timeout is None else args.timeout)


def _each(subjects: list[str], flow: Callable[[str], flows.CacheOutcome]) -> list[flows.CacheOutcome]:
    """Run ``flow`` per cache; a rejection is a row, a store error a row that makes exit 2."""
    outcomes = []
    for subject in subjects:
        try:
            outcomes.append(flow(subject))
        except PlanCacheError as exc:
            outcomes.append(flows.CacheOutcome(subject, "rejected" if isinstance(exc, Rejected) else "error",
                                               exc.reason.value, exc.detail))
    return outcomes


def _report(args: argparse.Namespace, outcomes: list[flows.CacheOutcome], listing: bool = False) -> int:
    """Print the rows (or the JSON report) and return the exit code; ``ls`` without keys only
    describes, so an unverified cache is no failure there."""
    code = EXIT_CONFIG if any(o.action == "error" for o in outcomes) else (
        EXIT_REJECTED if not listing and any(not o.ok for o in outcomes) else 0)
    if args.json:
        report(args, code == 0, action=args.compile_command, caches=[{
            "cache": o.subject, "action": o.action, "ok": o.ok and o.action != "error", "reason": o.reason or None,
            "detail": o.detail or None, "files": o.files, "bytes": o.size, "signers": list(o.signers),
        } for o in outcomes])
    else:
        print_table([(o.subject, o.action, o.files or "", f"{o.size / 2**20:.1f}" if o.size else "",
                      ", ".join(o.signers), o.reason, o.detail) for o in outcomes], HEADERS)
    return code


def cmd_sign(args: argparse.Namespace) -> int:
    root, signer, now = _root(args), required_signer(args), utcnow()
    return _report(args, _each(_subjects(args, root.subjects()),
                               lambda s: flows.sign_cache(root, s, signer, now, args.expires_in, args.comment)))


def cmd_verify(args: argparse.Namespace) -> int:
    root, keyring, now = _root(args), _keyring(args), utcnow()
    return _report(args, _each(_subjects(args, root.subjects()), lambda s: flows.verify_cache(root, s, keyring, now)))


def cmd_ls(args: argparse.Namespace) -> int:
    root = _root(args)
    if args.trusted_keys or os.environ.get("PLANCACHE_TRUSTED_KEYS"):
        return cmd_verify(args)

    outcomes = _each(_subjects(args, root.subjects()), lambda s: flows.describe_cache(root, s))
    return _report(args, outcomes, listing=True)


def cmd_push(args: argparse.Namespace) -> int:
    root, now = _root(args), utcnow()
    keyring = signer_keyring(required_signer(args)) if args.key else _keyring(args)
    store = _store(args)
    deadline = time.monotonic() + store.timeout
    return _report(args, _each(_subjects(args, root.subjects()),
                               lambda s: flows.push_cache(store, root, s, keyring, now, deadline)))


def cmd_pull(args: argparse.Namespace) -> int:
    root, keyring, now = _root(args), _keyring(args), utcnow()
    store = _store(args)
    deadline = time.monotonic() + store.timeout
    subjects = _subjects(args, archives.list_subjects(store, deadline) if not args.cache else [])
    return _report(args, _each(subjects, lambda s: flows.pull_cache(store, root, s, keyring, now, deadline)))

