"""Flags of the commands that audit plans where they lie: ``verify``, ``ls``, ``inspect``.

One family because each reads plans (a directory, a store URL, one file) and reports on them
without changing anything; their code is in :mod:`..plans.offline` (``verify``, ``ls``: the
offline audit) and :mod:`..plans.inspect_command`, imported only when one of them runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...settings import DEFAULT_TIMEOUT, TRUSTED_KEYS_ENV
from ..args import positive_int
from ..flag_objects import add_store_options, add_trust_options, add_trusted_root
from .shared_flags import add_command, json_flag, quiet_flag, subject_flag

if TYPE_CHECKING:
    from .shared_flags import Sub


def add_audit_commands(sub: Sub) -> None:
    for name, summary, description in (
        (
            "verify",
            "verify every plan and signature (exit 1 if any is bad, or if there are none)",
            "Verify each plan against the trusted keys and print a table (or --json). Exit 0 if "
            "all are valid; 1 if any is invalid or unsigned, or if the location holds no plans "
            "(unless --allow-empty); 2 on errors, including a bucket or directory that does not "
            "exist.",
        ),
        (
            "ls",
            "list plans with their sizes, signers and status",
            "List plans: fingerprint, KV cache GiB, baseline GiB, signer, signed at, expiry, "
            "status. Without trusted keys, values are shown unverified. Exit 2 if the bucket or "
            "directory does not exist.",
        ),
    ):
        p = add_command(sub, name, f"plans.offline:cmd_{name}", summary, description)
        add_trust_options(p)
        json_flag(p)
        p.add_argument("--jobs", type=positive_int, help="worker processes (default: one per core)")
        add_store_options(p)
        quiet_flag(p)
        subject_flag(
            p,
            "list only what is attached to this image (oci:// stores)"
            if name == "ls"
            else "verify only what is attached to this image (oci:// stores)",
        )
        if name == "verify":
            p.add_argument(
                "--fingerprint",
                action="append",
                metavar="FP",
                help="verify only this plan (repeatable; one absent is a failure: missing)",
            )
            p.add_argument(
                "--allow-empty",
                action="store_true",
                help="a location without plans is not a failure",
            )
            p.add_argument(
                "--report",
                metavar="FILE",
                help="also write the JSON report to FILE, atomically (a failure report when the "
                "audit cannot run)",
            )
        p.add_argument(
            "location",
            nargs="?",
            metavar="DIR|URL",
            help="plan directory or store URL (default: vLLM's plan directory, "
            "$VLLM_CACHE_ROOT/startup_plan)",
        )

    p = add_command(
        sub,
        "inspect",
        "plans.inspect_command:cmd_inspect",
        "show one plan file and its signature in detail",
        "Show a plan (or its .sig) in detail: fields, envelope, statement, and, with trusted keys, "
        "the verification result. A Sigstore bundle (a keyless signature) shows its payload's "
        "statement, as claimed until it verifies. FILE may be a store URL, e.g. "
        "s3://bucket/prefix/startup_plan_<fp>.json.",
    )
    p.add_argument("file", metavar="FILE|URL")
    p.add_argument(
        "--trusted-keys", metavar="PATH", help=f"verify as well (default: ${TRUSTED_KEYS_ENV})"
    )
    add_trusted_root(p)
    add_store_options(p, f"budget of the fetch for a URL (default {DEFAULT_TIMEOUT:g} s)")
    subject_flag(p, "read the plan attached to this image (oci:// stores)")
    json_flag(p)
