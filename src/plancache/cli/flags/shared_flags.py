"""The flags and help that several commands share, and how a command is declared.

Apart from the families of commands (:mod:`.signing_flags`, :mod:`.audit_flags`,
:mod:`.store_flags`, :mod:`.diagnose_flags`, :mod:`.compile_cache_flags`) because several families
use them: ``--json``, ``--quiet``, ``--debug``, ``--subject``, the flags of a new signature
(``sign`` and ``push``), the key reference's help, and :func:`add_command`, which records the
``"module:function"`` a command runs (imported only then, by :mod:`plancache.cli.main`).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..args import duration, key_value

if TYPE_CHECKING:
    from ..main import Parser

    Sub = argparse._SubParsersAction[Parser]
    """Where a command is added: the subcommands of ``plancache`` or of ``compile-cache``."""

KEYREF_HELP = (
    "key reference: a private key file, env://VAR, pkcs11:…, awskms://…, gcpkms://…, sigstore"
)


def json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON report on stdout (schema plancache.report/v1), errors included",
    )


def subject_flag(p: argparse.ArgumentParser, text: str) -> None:
    """``--subject IMAGE``: an ``oci://`` store's storage option ``subject`` (docs/stores.md)."""
    p.add_argument("--subject", metavar="IMAGE", help=f"{text}: TAG, @sha256:..., or HOST/REPO:TAG")


def quiet_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def new_signature_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--expires-in",
        type=duration,
        metavar="DURATION",
        help="lifetime of new signatures, e.g. 30d, 12h",
    )
    p.add_argument("--comment", help="free text recorded in new signatures")
    p.add_argument(
        "--fact",
        type=key_value,
        action="append",
        metavar="KEY=VALUE",
        help="provenance fact recorded in new signatures, e.g. gpu_memory_utilization=0.9 "
        "(repeatable); gpu_memory_utilization, device_name and device_total_memory are the gate's "
        "conditions",
    )
    p.add_argument(
        "--inputs",
        metavar="FILE",
        help="plancache fingerprint --json's output: each plan whose fingerprint it lists gets "
        "that rank's fingerprint inputs in its new signature, in the clear (plancache explain)",
    )


def add_command(
    sub: Sub, name: str, handler: str, summary: str, description: str | None
) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=summary, description=description)
    p.set_defaults(handler=handler)
    debug(p, argparse.SUPPRESS)
    return p


def debug(p: argparse.ArgumentParser, default: object = False) -> None:
    """``--debug``, before or after the command: PLANCACHE_DEBUG=1 for this run (tracebacks of
    internal errors, the SDKs' own warnings; never their request logs, which carry tokens)."""
    p.add_argument(
        "--debug",
        action="store_true",
        default=default,
        help="show tracebacks of internal errors and the SDKs' warnings (as PLANCACHE_DEBUG=1)",
    )
