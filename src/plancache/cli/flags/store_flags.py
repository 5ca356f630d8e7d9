"""Flags of the commands that move plans between a directory and a store, or delete them from a
store: ``push``, ``pull``, ``prune``.

One family because each takes a store URL and a budget for it, and each changes something (a
store, or a plan directory); their code is in :mod:`..plans.remote`, imported only when one of
them runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...settings import BOOT_TIMEOUT, BULK_TIMEOUT, DEFAULT_TIMEOUT, SIGNING_KEY_ENV
from ..args import duration
from ..flag_objects import (
    add_cosign_options,
    add_identity_token,
    add_store_options,
    add_trust_options,
)
from .shared_flags import (
    KEYREF_HELP,
    add_command,
    json_flag,
    new_signature_flags,
    quiet_flag,
    subject_flag,
)

if TYPE_CHECKING:
    from .shared_flags import Sub


def add_store_commands(sub: Sub) -> None:
    p = add_command(
        sub,
        "push",
        "plans.remote:cmd_push",
        "sign (with --key) and upload plans to a store",
        "Upload the plans in DIR (or the --fingerprint ones) and their signatures to URL. With "
        "--key, plans lacking a valid signature by that key are signed first. Unsigned plans are "
        "refused unless --allow-unsigned. Objects the store already holds byte-identical are "
        "skipped. --dry-run signs and uploads nothing and says what would be.",
    )
    p.add_argument(
        "--key",
        metavar="KEYREF",
        help=f"sign first with this {KEYREF_HELP} (default: ${SIGNING_KEY_ENV})",
    )
    add_identity_token(p)
    p.add_argument(
        "--allow-unsigned", action="store_true", help="push plans without a signature too"
    )
    p.add_argument(
        "--fingerprint", action="append", metavar="FP", help="push only this plan (repeatable)"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="show what would be signed and uploaded; change nothing",
    )
    p.add_argument(
        "--set-replicas",
        type=int,
        default=1,
        metavar="N",
        help="with --key: copies of each plan set to write (a boot storm on Azure: see "
        "docs/boot-storm.md)",
    )
    new_signature_flags(p)
    add_cosign_options(p)
    add_store_options(p)
    subject_flag(
        p, "attach what is pushed to this image (oci:// stores: referrers API or tag schema)"
    )
    json_flag(p)
    quiet_flag(p)
    p.add_argument(
        "dir", nargs="?", metavar="DIR", help="plan directory (default: vLLM's plan directory)"
    )
    p.add_argument(
        "url",
        metavar="URL",
        help="store URL, e.g. s3://bucket/prefix, gs://bucket/prefix, file:///path",
    )

    p = add_command(
        sub,
        "pull",
        "plans.remote:cmd_pull",
        "fetch plans from a store, verify them, write the valid ones into DIR",
        "Fetch each plan (or the --fingerprint ones) and its signature, verify them against the "
        "trusted keys, and write only verified plans into DIR, atomically. Exit 0 all verified, 1 "
        "any rejected or missing, 2 usage, configuration or store error (including a bucket that "
        "does not exist).",
    )
    add_trust_options(p)
    p.add_argument(
        "--fingerprint", action="append", metavar="FP", help="pull only this plan (repeatable)"
    )
    add_store_options(
        p,
        f"end-to-end budget (default {DEFAULT_TIMEOUT:g} s with --fingerprint, else "
        f"{BULK_TIMEOUT:g} s, or {BOOT_TIMEOUT:g} s with --boot)",
    )
    p.add_argument(
        "--boot",
        action="store_true",
        help=f"on a boot's critical path: a whole-store pull's budget defaults to {BOOT_TIMEOUT:g} "
        "s",
    )
    subject_flag(p, "pull only what is attached to this image (oci:// stores)")
    json_flag(p)
    quiet_flag(p)
    p.add_argument("url", metavar="URL", help="store URL")
    p.add_argument(
        "dir", nargs="?", metavar="DIR", help="plan directory (default: vLLM's plan directory)"
    )

    p = add_command(
        sub,
        "prune",
        "plans.remote:cmd_prune",
        "delete old, unsigned, invalid or revoked plans from a store",
        "Delete plans (and their signatures) from URL: signed longer ago than --older-than; "
        "without a signature (--unsigned); that no longer verify because their signing key or "
        "sigstore identity is revoked (--revoked); or that fail verification for any reason but "
        "a store error (--invalid). A plan is deleted only if the store still holds the bytes "
        "that were judged (re-read and compared right before the delete, and on S3, GCS and Azure "
        "deleted only if still the version re-read: ETag or generation precondition, once the "
        "store has shown it honours one on a canary object; else refused unless "
        "--unconditional).",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--older-than",
        type=duration,
        metavar="DURATION",
        help="signed longer ago than this, e.g. 30d",
    )
    what.add_argument(
        "--revoked",
        action="store_true",
        help="signed only by keys or sigstore identities the trusted-keys file revokes (a file "
        "of @revoked lines alone will do)",
    )
    what.add_argument("--unsigned", action="store_true", help="plans without a signature sidecar")
    what.add_argument(
        "--invalid",
        action="store_true",
        help="plans that fail verification under the trusted keys (unsigned, tampered, expired, "
        "...)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="list what would be deleted, delete nothing"
    )
    p.add_argument(
        "--unconditional",
        action="store_true",
        help="delete after the re-read even where the store does not honour conditional deletes "
        "(checked before the first delete, else refused): a plan re-pushed in between may be "
        "deleted",
    )
    add_trust_options(p)
    add_store_options(p)
    subject_flag(
        p,
        "judge and delete only what is attached to this image (oci:// stores), e.g. a "
        "referrer that fails verification",
    )
    json_flag(p)
    quiet_flag(p)
    p.add_argument("url", metavar="URL", help="store URL")
