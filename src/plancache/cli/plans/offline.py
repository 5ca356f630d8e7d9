"""The local subcommands: keygen, sign, verify, ls, inspect (verify and ls also take a URL).

An audit must not pass by accident: a location that does not exist is exit 2 (raised by the
library), and ``verify`` over a location with no plans exits 1 ("no plans", naming deeper
prefixes that hold some) unless ``--allow-empty``.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...pipeline.audit import PlanReport, all_valid, audit_plans, check, list_plans
from ...pipeline.directory_signing import sign_directory
from ...pipeline.locations import (
    BULK_TIMEOUT,
    Location,
    is_url,
    local_dir,
    no_plans_message,
    open_location,
    open_url,
    require_existing,
)
from ...pipeline.resolver import utcnow
from ...storage.local.localdir import LocalPlanDir
from ...trust import envelope as dsse
from ...trust.display import safe_text
from ...trust.errors import ConfigError, PlanCacheError
from ...trust.plans.plan import fingerprint_of_plan_name, fingerprint_of_sig_name, plan_name
from ...trust.result import PlanResult
from ...trust.statement import CONDITION_KEYS, format_time, parse_statement
from ..flag_objects import (
    check_places,
    optional_policy,
    required_policy,
    required_signer,
    signing_request,
    storage_options,
    wanted_fingerprints,
)
from ..output import (
    Progress,
    document,
    gib,
    print_json,
    print_table,
    render_json,
    report,
    status_text,
)

NO_PLANS = "no-plans"


def _name_of(path: Path) -> str:
    """The default comment: the file name, with what a key line cannot hold (blanks at either
    end, control characters, a lone surrogate) made ``_``. An explicit --comment is never changed."""
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
            f"wrote {safe_text(args.path, 500)} (private, mode 0600) and {safe_text(args.path, 500)}.pub"
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
        f"signed without {', '.join(missing)}: the gate cannot compare them, so these plans apply on "
        f"workers at any setting (record them: {record})"
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
                f"{len(outcomes)} plan(s) in {directory}: {counts['signed']} signed, {counts['co-signed']} "
                f"co-signed, {counts['kept']} already signed, {refused} refused (key {signer.keyid})",
                file=sys.stderr,
            )
    return 1 if refused else 0


@dataclass
class Audit:
    """One ``verify`` or ``ls`` run: where, its plans' reports, and what its sets need."""

    source: Location
    reports: list[PlanReport]
    deadline: float | None
    """The command's one deadline (a store's; None for a directory): ``--timeout`` bounds the
    whole audit, plans and sets, never each read."""
    digests: dict[str, str] = field(default_factory=dict)
    """sha256 of each fetched plan: a set's members are compared with them (rollbacks)."""


def _audit(args: argparse.Namespace, policy: Any) -> Audit:
    """The plans' reports. On a store, ``--timeout`` is one deadline for the whole command, taken
    here once (before the store is opened: that counts too) and handed down to the listing,
    every fetch and, after, the sets: a fresh budget per read let six slow sets take 30 s."""
    started = time.monotonic()
    wanted = wanted_fingerprints(args) if getattr(args, "fingerprint", None) else []
    deadline = None
    if is_url(str(args.location) if args.location else None):
        from ...storage.deadline import checked_budget  # a store's machinery, for a store only

        budget = checked_budget(args.timeout, BULK_TIMEOUT)
        deadline = started + budget  # computed once, handed to every listing and read below
        source: Location = open_url(str(args.location), storage_options(args), budget, deadline)
    else:
        source = open_location(args.location, storage_options(args), args.timeout)
    audit = Audit(source, [], deadline)
    fingerprints = wanted or list_plans(source, deadline)
    with Progress("verify" if isinstance(source, LocalPlanDir) else "fetch", args.quiet) as bar:
        audit.reports = audit_plans(
            source,
            fingerprints,
            policy,
            utcnow(),
            jobs=args.jobs,
            progress=bar,
            deadline=deadline,
            digests=audit.digests,
        )
    if wanted and all(r.outcome == "missing" for r in audit.reports):
        require_existing(
            source, deadline
        )  # a mistyped bucket is a configuration error, not two misses
    return audit


def cmd_verify(args: argparse.Namespace) -> int:
    if args.report:
        _check_report_target(args.report)
    try:
        return _verify(args)
    except BaseException as exc:
        if args.report and not isinstance(
            exc, SystemExit
        ):  # never a stale success, whatever failed
            if isinstance(exc, PlanCacheError):
                error = (exc.reason.value, exc.detail)
            elif isinstance(exc, KeyboardInterrupt):
                error = ("interrupted", "interrupted")
            else:
                error = ("internal-error", f"{type(exc).__name__}: {safe_text(exc, 300)}")
            try:
                _write_report(
                    args.report, document("verify", False, {"location": args.location or ""}, error)
                )
            except PlanCacheError:
                pass  # the report cannot be written: the first failure is the one to tell
        raise


def _check_report_target(path: str) -> None:
    """``--report`` replaces a regular file or creates one; anything else (``/dev/full``, a FIFO,
    a directory, a symlink) is refused before the audit runs, not renamed over."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"--report {safe_text(path, 200)}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(
            f"--report {safe_text(path, 200)} exists and is not a regular file: refusing to replace it"
        )


def _write_report(path: str, doc: dict[str, Any]) -> None:
    from ...storage.local.files import write_atomic

    write_atomic(Path(path), render_json(doc).encode())


def _sets(args: argparse.Namespace, audit: Audit, policy: Any) -> list[Any]:
    """The store's plan sets, verified under ``policy`` (docs/boot-storm.md) inside the audit's
    deadline, each compared with the per-plan objects that verified (an older one is a
    rollback); none for a directory or when only some ``--fingerprint`` plans were asked for."""
    if isinstance(audit.source, LocalPlanDir) or getattr(args, "fingerprint", None):
        return []  # an offline audit of a directory imports no store machinery
    from ...pipeline.plan_sets.set_audit import audit_sets, plan_facts

    facts = plan_facts(audit.reports, audit.digests) if policy is not None else {}
    return audit_sets(audit.source, policy, utcnow(), audit.deadline, plans=facts)


def _print_sets(sets: list[Any]) -> None:
    if sets:
        print_table(
            [
                (
                    s.name,
                    ", ".join(s.signers),
                    s.status,
                    s.reason if s.reason not in ("ok", s.status) else "",
                    f"{len(s.fingerprints)} rank(s)" + (f"; {s.detail}" if s.detail else ""),
                )
                for s in sets
            ],
            ["PLAN SET", "SIGNER", "STATUS", "REASON", "DETAIL"],
        )


def _verify(args: argparse.Namespace) -> int:
    policy = required_policy(args)
    audit = _audit(args, policy)
    source, reports = audit.source, audit.reports
    sets = _sets(args, audit, policy)
    ok = all_valid(reports) and all(s.ok for s in sets)
    error = None
    if not reports:
        message = no_plans_message(source)
        ok = ok and args.allow_empty  # --allow-empty forgives no plans, never a bad plan set
        error = None if args.allow_empty else (NO_PLANS, message)
        forgiven = " (--allow-empty: not a failure)" if args.allow_empty else ""
        print(f"plancache: {message}{forgiven}", file=sys.stderr)
    if args.report or args.json:
        doc = document(
            "verify",
            ok,
            {
                "location": str(source),
                "plans": [r.to_json() for r in reports],
                "plan_sets": [s.to_json() for s in sets],
            },
            error,
        )
        if args.report:
            _write_report(args.report, doc)
        if args.json:
            print_json(doc)
    if not args.json and reports:
        rows = [
            (
                r.fingerprint,
                ", ".join(r.signers),
                r.outcome,
                r.reason if r.reason not in ("ok", r.outcome) else "",
                r.detail,
            )
            for r in reports
        ]
        print_table(rows, ["PLAN", "SIGNER", "STATUS", "REASON", "DETAIL"])
        bad = sum(not r.ok for r in reports)
        print(
            f"{len(reports)} plan(s) in {source}: {len(reports) - bad} valid, {bad} not",
            file=sys.stderr,
        )
    if not args.json and sets:
        _print_sets(sets)
        bad = sum(not s.ok for s in sets)
        print(
            f"{len(sets)} plan set(s) in {source}: {len(sets) - bad} valid, {bad} not",
            file=sys.stderr,
        )
    return 0 if ok else 1


def cmd_ls(args: argparse.Namespace) -> int:
    policy = optional_policy(args)
    audit = _audit(args, policy)
    source, reports = audit.source, audit.reports
    sets = _sets(args, audit, policy)
    if not reports:
        print(f"plancache: {no_plans_message(source)}", file=sys.stderr)
    if args.json:
        report(
            args,
            True,
            location=str(source),
            plans=[r.to_json() for r in reports],
            plan_sets=[s.to_json() for s in sets],
        )
        return 0
    rows = [
        (
            r.fingerprint,
            gib(r.kv_cache_memory_bytes),
            gib(r.free_memory_baseline),
            ", ".join(r.signers),
            r.signed_at,
            r.expires_at,
            status_text(r.outcome, r.reason),
        )
        for r in reports
    ]
    print_table(
        rows, ["PLAN", "KV_GIB", "BASELINE_GIB", "SIGNER", "SIGNED_AT", "EXPIRES", "STATUS"]
    )
    _print_sets(sets)
    if policy is None:
        print(
            "no trusted keys given: values are shown unverified (--trusted-keys to verify)",
            file=sys.stderr,
        )
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from ...pipeline.locations import is_url, open_url
    from ...settings import DEFAULT_TIMEOUT
    from ...storage.local.files import read_capped
    from ...trust.plans.plan import MAX_PLAN_BYTES

    url = str(args.file) if is_url(args.file) else ""
    parent, _, name = url.rpartition("/") if url else ("", "", Path(args.file).name)
    fp = fingerprint_of_plan_name(name) or fingerprint_of_sig_name(name)
    if fp is None:
        raise ConfigError(f"{name} is not named startup_plan_<16 hex>.json or .json.sig")
    if parent:  # a store URL: the plan and its sidecar, fetched as pull fetches them
        store = open_url(
            parent, storage_options(args), DEFAULT_TIMEOUT if args.timeout is None else args.timeout
        )
        fetched = store.fetch(fp)
        if fetched.error is not None:
            raise fetched.error
        plan_bytes, sig_bytes, where = (
            fetched.plan_bytes,
            fetched.sig_bytes,
            f"{store.url}/{plan_name(fp)}",
        )
        if plan_bytes is None and sig_bytes is None:
            raise ConfigError(f"{args.file} does not exist")
    else:
        path = Path(args.file)
        directory = LocalPlanDir(path.parent)
        plan_bytes, sig_bytes = directory.read(fp)
        where = str(directory.path / plan_name(fp))
        if plan_bytes is None and read_capped(path, MAX_PLAN_BYTES) is None:
            raise ConfigError(f"{path} does not exist")
    policy = optional_policy(args)
    result = check(
        PlanResult(fp, "store" if parent else "local", plan_bytes, sig_bytes), policy, utcnow()
    )
    info: dict[str, Any] = {"file": where, **result.to_json()}
    if sig_bytes is not None:
        try:
            env = dsse.decode(sig_bytes)
            info["envelope"] = {
                "payloadType": env.payload_type,
                "keyids": [s.keyid for s in env.signatures],
            }
            info["statement"] = _statement_json(env.payload)
        except PlanCacheError as exc:
            info["envelope"] = {"error": f"{exc.reason.value}: {exc.detail}"}
    ok = result.status in ("valid", "unverified")
    if args.json:
        report(args, ok, **info)
    else:
        for key, value in _flatten("", info):
            print(f"{key:44} {safe_text(value, 2000)}".rstrip())
    return 0 if ok else 1


def _flatten(prefix: str, value: Any) -> Iterator[tuple[str, str]]:
    """Nested JSON as ``a.b  value`` lines: no Python reprs in human output."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _flatten(f"{prefix}.{key}" if prefix else str(key), inner)
    elif isinstance(value, list):
        if value and all(isinstance(v, dict) for v in value):
            for i, inner in enumerate(value):
                yield from _flatten(f"{prefix}.{i + 1}", inner)
        else:
            yield prefix, ", ".join(str(v) for v in value)
    else:
        yield (
            prefix,
            "" if value is None else str(value).lower() if isinstance(value, bool) else str(value),
        )


def _statement_json(payload: bytes) -> Any:
    try:
        st = parse_statement(payload)
    except PlanCacheError as exc:
        return {"error": f"{exc.reason.value}: {exc.detail}"}
    return {
        "subject": st.subject_name,
        "sha256": st.subject_sha256,
        "fingerprint": st.fingerprint,
        "signed_at": format_time(st.signed_at),
        "expires_at": format_time(st.expires_at) if st.expires_at else None,
        "comment": st.comment,
        "provenance": dict(st.provenance),
    }
