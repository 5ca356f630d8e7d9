"""The commands that make keys and signatures in place: ``keygen`` and ``sign``.

Apart from the offline audit (:mod:`.offline`) because they write (a key pair, sidecars) where
the audit only reads; ``push --key`` (:mod:`.remote`) signs the same way and warns with the same
words when a new signature leaves the gate's conditions unrecorded (:func:`conditions_warning`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...pipeline.directory_signing import sign_directory
from ...pipeline.locations import local_dir
from ...pipeline.resolver import utcnow
from ...trust.display import safe_text
from ...trust.statement import CONDITION_KEYS
from ..flag_objects import check_places, required_signer, signing_request
from ..output import print_table, report


def _name_of(path: Path) -> str:
    """The default comment: the file name, with what a key line cannot hold (blanks at either
    end, control characters, a lone surrogate) made ``_``. An explicit --comment is never
    changed."""
    name = "".join(
        "_" if not c.isprintable() or "\ud800" <= c <= "\udfff" else c for c in path.name
    )
    return name.strip() or "key"


def cmd_keygen(args: argparse.Namespace) -> int:
    from ...keys.keyfile import generate_keypair

    signer = generate_keypair(
        Path(args.path),
        args.force,
        args.comment or _name_of(Path(args.path)),
        openssh=args.format == "openssh",
    )
    if args.json:
        report(
            args,
            True,
            private_key=str(args.path),
            public_key=f"{args.path}.pub",
            keyid=signer.keyid,
        )
    else:
        print(
            f"wrote {safe_text(args.path, 500)} (private, mode 0600) and "
            f"{safe_text(args.path, 500)}.pub"
        )
        print(f"key id {signer.keyid}")
    return 0


def unrecorded_conditions(facts: Mapping[str, Any]) -> list[str]:
    """The gate's conditions a new signature would not record (so the gate cannot compare them)."""
    return [key for key in CONDITION_KEYS if key not in facts]


_EXAMPLE = {"gpu_memory_utilization": "0.9", "device_name": "...", "device_total_memory": "BYTES"}


def conditions_warning(missing: list[str]) -> str:
    record = " ".join(f"--fact {key}={_EXAMPLE.get(key, '...')}" for key in missing)
    return (
        f"signed without {', '.join(missing)}: the gate cannot compare them, so these plans apply "
        f"on workers at any setting (record them: {record})"
    )


def cmd_sign(args: argparse.Namespace) -> int:
    check_places(args)
    signer = required_signer(args)
    directory = local_dir(args.dir)
    request = signing_request(args)
    outcomes = sign_directory(directory, signer, utcnow(), request)
    refused = sum(o.refused for o in outcomes)
    fresh = any(o.action in ("signed", "replaced") for o in outcomes)
    missing = unrecorded_conditions(dict(request.facts or {})) if fresh else []
    warnings = [conditions_warning(missing)] if missing else []
    for warning in warnings:
        print(f"plancache: warning: {warning}", file=sys.stderr)
    if args.json:
        report(
            args,
            not refused,
            key=signer.keyid,
            warnings=warnings,
            plans=[
                {"fingerprint": o.fingerprint, "action": o.label, "detail": o.detail}
                for o in outcomes
            ],
        )
    else:
        print_table(
            [(o.fingerprint, o.label, o.detail) for o in outcomes], ["PLAN", "ACTION", "DETAIL"]
        )
        counts = {a: sum(o.action == a for o in outcomes) for a in ("signed", "co-signed", "kept")}
        if not args.quiet:
            print(
                f"{len(outcomes)} plan(s) in {directory}: {counts['signed']} signed, "
                f"{counts['co-signed']} co-signed, {counts['kept']} already signed, {refused} "
                f"refused (key {signer.keyid})",
                file=sys.stderr,
            )
    return 1 if refused else 0
