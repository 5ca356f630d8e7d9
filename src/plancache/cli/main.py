"""``plancache`` entry point: the parser, and the one place user errors become one line.

Exit codes: 0 success; 1 some plan is invalid, unsigned or was refused; 2 usage or
configuration error (argparse uses 2 as well); 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Callable, Sequence

from .. import __version__
from ..trust.display import safe_text
from ..trust.errors import PlanCacheError
from . import compile_cache, demo, fingerprint, offline, remote
from .args import duration, key_value, positive_int
from .inputs import add_cosign_options, add_store_options, add_trust_options

EXIT_CONFIG = 2

Command = Callable[[argparse.Namespace], int]


def _location(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "location",
        nargs="?",
        metavar="DIR",
        help=f"{what} (default: vLLM's plan directory, $VLLM_CACHE_ROOT/startup_plan)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="plancache",
        description="Signed, shareable vLLM startup plans. Sign plans in CI, pull them verified "
        "on boot, audit them offline.",
        epilog="Exit codes: 0 ok; 1 a plan is invalid, unsigned or refused; 2 usage or configuration error.",
    )
    parser.add_argument("--version", action="version", version=f"plancache {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("keygen", help="create an Ed25519 signing key (PATH) and its public key (PATH.pub)",
                       description="Write a new Ed25519 private key to PATH (PEM PKCS#8, mode 0600; encrypted "
                       "when PLANCACHE_KEY_PASSPHRASE is set) and its OpenSSH public line to PATH.pub, which is "
                       "itself a valid trusted-keys file.")
    p.add_argument("path", metavar="PATH")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.add_argument("--comment", help="name recorded in PATH.pub (default: the file name)")
    p.set_defaults(func=offline.cmd_keygen)

    p = sub.add_parser("sign", help="sign every plan in DIR that lacks a valid signature by the key",
                       description="Sign each plan in DIR that lacks a valid signature by KEY. A plan already "
                       "signed by other keys is co-signed (same statement, one more signature) only if that statement verifies "
                       "under --trusted-keys and says what this command would sign; otherwise it is refused (exit 1) "
                       "unless --replace.")
    p.add_argument("--key", metavar="KEY", help="private key file (default: $PLANCACHE_SIGNING_KEY)")
    p.add_argument("--expires-in", type=duration, metavar="DURATION", help="signature lifetime, e.g. 30d, 12h")
    p.add_argument("--comment", help="free text recorded in the signed statement")
    p.add_argument("--fact", type=key_value, action="append", metavar="KEY=VALUE",
                   help="provenance fact to sign, e.g. gpu_memory_utilization=0.9 (repeatable)")
    add_cosign_options(p)
    p.add_argument("--json", action="store_true", help="print a JSON report")
    p.add_argument("dir", nargs="?", metavar="DIR", help="plan directory (default: vLLM's plan directory)")
    p.set_defaults(func=offline.cmd_sign)

    for name, func, summary, description in (
        ("verify", offline.cmd_verify, "verify every plan and signature (exit 1 if any is bad)",
         "Verify each plan against the trusted keys and print a table (or --json). "
         "Exit 0 if all are valid, 1 if any is invalid or unsigned, 2 on errors."),
        ("ls", offline.cmd_ls, "list plans with their sizes, signers and status",
         "List plans: fingerprint, KV cache GiB, baseline GiB, signer, signed at, expiry, status. "
         "Without trusted keys, values are shown unverified."),
    ):
        p = sub.add_parser(name, help=summary, description=description)
        add_trust_options(p)
        p.add_argument("--json", action="store_true", help="print a JSON report")
        p.add_argument("--jobs", type=positive_int, help="worker processes (default: one per core)")
        add_store_options(p)
        _location(p, "plan directory or store URL")
        p.set_defaults(func=func)

    p = sub.add_parser("inspect", help="show one plan file and its signature in detail",
                       description="Show a plan (or its .sig) in detail: fields, envelope, statement, and, "
                       "with trusted keys, the verification result.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--trusted-keys", metavar="PATH", help="verify as well (default: $PLANCACHE_TRUSTED_KEYS)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=offline.cmd_inspect)

    remote.add_parsers(sub)
    demo.add_parser(sub)
    fingerprint.add_parser(sub)
    compile_cache.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Command = args.func
    try:
        return func(args)
    except PlanCacheError as exc:
        print(f"plancache: error: {safe_text(exc.detail, 500)}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        print("plancache: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug, not a user mistake: one line, the traceback on request
        if os.environ.get("PLANCACHE_DEBUG"):
            traceback.print_exc()
        print(f"plancache: internal error: {type(exc).__name__}: {safe_text(exc, 300)} (PLANCACHE_DEBUG=1 shows more)",
              file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
