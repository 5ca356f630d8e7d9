"""Flags of ``compile-cache`` and its actions: ``sign``, ``verify``, ``ls``, ``push``, ``pull``.

One family because every action works on vLLM's compile caches under one cache root (ROOT) and
shares its flags (:func:`_cache_common`); their code is in :mod:`..compile_cache`, imported only
when one of them runs.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ...settings import BULK_TIMEOUT, SIGNING_KEY_ENV, URL_ENV
from ..args import duration
from ..flag_objects import add_identity_token, add_store_options, add_trust_options
from .shared_flags import add_command, json_flag

if TYPE_CHECKING:
    from .shared_flags import Sub


def add_compile_cache_commands(sub: Sub) -> None:
    parser = sub.add_parser(
        "compile-cache",
        help="sign, verify, list, push and pull vLLM's torch.compile cache",
        description="vLLM's torch.compile/AOT cache under ROOT/torch_compile_cache, signed as a "
        "closed world (every file's path, size and sha256). Exit 0 all fine; 1 a cache rejected; 2 "
        "usage, configuration or store error.",
    )
    actions = parser.add_subparsers(dest="compile_command", metavar="ACTION", required=True)
    p = add_command(
        actions,
        "sign",
        "compile_cache:cmd_sign",
        "sign every cache directory as it is now (run where it was built)",
        None,
    )
    p.add_argument(
        "--key", metavar="KEY", help=f"private key reference (default: ${SIGNING_KEY_ENV})"
    )
    add_identity_token(p)
    p.add_argument(
        "--expires-in", type=duration, metavar="DURATION", help="signature lifetime, e.g. 30d"
    )
    p.add_argument("--comment", default="", help="free text recorded in the signed manifest")
    p.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="longest wait for each cache's node lock, held by a vLLM worker or another command "
        f"(default {BULK_TIMEOUT:g} s; past it the cache is an error, exit 2)",
    )
    _cache_common(p)
    p = add_command(
        actions,
        "verify",
        "compile_cache:cmd_verify",
        "verify every cache directory (exit 1 if any is bad)",
        None,
    )
    add_trust_options(p)
    _cache_common(p)
    p = add_command(
        actions,
        "ls",
        "compile_cache:cmd_ls",
        "list cache directories (verified with trusted keys, else as found)",
        None,
    )
    add_trust_options(p)
    _cache_common(p)
    for name, summary in (
        ("push", "upload verified caches: one archive and its signature each"),
        ("pull", "download, verify, extract and install caches"),
    ):
        p = add_command(
            actions,
            name,
            f"compile_cache:cmd_{name}",
            summary,
            f"The store URL is URL, --url or ${URL_ENV}; a lone positional is the URL when it has "
            "a scheme (s3://, gs://, file://, ...), else ROOT.",
        )
        add_trust_options(p)
        if name == "push":
            p.add_argument(
                "--key", metavar="KEY", help="verify with this signing key's own public key instead"
            )
        p.add_argument(
            "--url", metavar="URL", help=f"store URL, e.g. s3://bucket/prefix (default: ${URL_ENV})"
        )
        add_store_options(
            p,
            "overall budget of each store operation, and longest wait for each cache's node lock "
            f"(default {BULK_TIMEOUT:g} s)",
        )
        url_help = f"store URL, e.g. s3://bucket/prefix (default: --url, else ${URL_ENV})"
        if name == "pull":  # the order of plancache pull URL [DIR]
            p.add_argument("source", nargs="?", metavar="URL", help=url_help)
        _cache_common(p, name)
        if name == "push":  # the order of plancache push [DIR] URL
            p.add_argument("target", nargs="?", metavar="URL", help=url_help)


def _cache_common(p: argparse.ArgumentParser, name: str = "") -> None:
    p.add_argument(
        "--cache",
        action="append",
        metavar="NAME",
        help="only this cache, e.g. torch_aot_compile/<64 hex> (repeatable; default: all)",
    )
    json_flag(p)
    exists = "created if missing" if name == "pull" else "must exist"
    p.add_argument(
        "root",
        nargs="?",
        metavar="ROOT",
        help=f"vLLM's cache root (default: $VLLM_CACHE_ROOT or ~/.cache/vllm; {exists})",
    )
