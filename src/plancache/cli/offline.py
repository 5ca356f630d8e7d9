"""The local subcommands: keygen, sign, verify, ls, inspect (verify and ls also take a URL)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..pipeline.audit import PlanReport, all_valid, audit_location, check
from ..pipeline.locations import local_dir
from ..pipeline.resolver import utcnow
from ..pipeline.signing import SigningRequest, sign_directory
from ..pipeline.trust_config import keys_source, load_trusted_keys
from ..storage.files import read_capped
from ..storage.keyfiles import generate_keypair
from ..storage.localdir import LocalPlanDir
from ..trust import envelope as dsse
from ..trust.display import safe_text
from ..trust.errors import ConfigError, PlanCacheError
from ..trust.plan import MAX_PLAN_BYTES, fingerprint_of_plan_name, fingerprint_of_sig_name, plan_name
from ..trust.result import PlanResult
from ..trust.statement import format_time, parse_statement
from .inputs import optional_policy, required_policy, required_signer, storage_options
from .output import Progress, gib, print_json, print_table


def signing_request(args: argparse.Namespace) -> SigningRequest:
    """What ``sign``/``push --key`` would sign; absent flags are "not asked" (None)."""
    source = keys_source(args.trusted_keys)
    keyring = load_trusted_keys(source) if source else None
    facts = dict(args.fact) if args.fact else None
    return SigningRequest(args.expires_in, args.comment, facts, keyring, args.replace)


def cmd_keygen(args: argparse.Namespace) -> int:
    signer = generate_keypair(Path(args.path), args.force, args.comment or Path(args.path).name)
    print(f"wrote {args.path} (private, mode 0600) and {args.path}.pub")
    print(f"key id {signer.keyid}")
    return 0


def cmd_sign(args: argparse.Namespace) -> int:
    signer = required_signer(args)
    directory = local_dir(args.dir)
    outcomes = sign_directory(directory, signer, utcnow(), signing_request(args))
    refused = sum(o.refused for o in outcomes)
    if args.json:
        print_json({"key": signer.keyid, "plans": [
            {"fingerprint": o.fingerprint, "action": o.label, "detail": o.detail} for o in outcomes]})
    else:
        print_table([(o.fingerprint, o.label, o.detail) for o in outcomes], ["PLAN", "ACTION", "DETAIL"])
        counts = {a: sum(o.action == a for o in outcomes) for a in ("signed", "co-signed", "kept")}
        print(
            f"{len(outcomes)} plan(s) in {directory}: {counts['signed']} signed, {counts['co-signed']} co-signed, "
            f"{counts['kept']} already signed, {refused} refused (key {signer.keyid})",
            file=sys.stderr,
        )
    return 1 if refused else 0


def _audit(args: argparse.Namespace, policy: Any) -> tuple[object, list[PlanReport]]:
    progress = Progress("verify")
    try:
        return audit_location(args.location, policy, utcnow(), storage_options(args), args.timeout, args.jobs,
                              progress.advance)
    finally:
        progress.close()


def cmd_verify(args: argparse.Namespace) -> int:
    source, reports = _audit(args, required_policy(args))
    ok = all_valid(reports)
    if args.json:
        print_json({"location": str(source), "plans": [r.to_json() for r in reports], "ok": ok})
    else:
        rows = [(r.fingerprint, ", ".join(r.signers), r.status, r.reason if r.reason not in ("ok", r.status) else "",
                 r.detail) for r in reports]
        print_table(rows, ["PLAN", "SIGNER", "STATUS", "REASON", "DETAIL"])
        bad = sum(not r.ok for r in reports)
        print(f"{len(reports)} plan(s) in {source}: {len(reports) - bad} valid, {bad} not", file=sys.stderr)
    return 0 if ok else 1


def cmd_ls(args: argparse.Namespace) -> int:
    policy = optional_policy(args)
    source, reports = _audit(args, policy)
    if args.json:
        print_json({"location": str(source), "plans": [r.to_json() for r in reports]})
        return 0
    rows = [
        (r.fingerprint, gib(r.kv_cache_memory_bytes), gib(r.free_memory_baseline), ", ".join(r.signers),
         r.signed_at, r.expires_at, r.status if r.status in ("valid", "unverified") else f"{r.status} ({r.reason})")
        for r in reports
    ]
    print_table(rows, ["PLAN", "KV_GIB", "BASELINE_GIB", "SIGNER", "SIGNED_AT", "EXPIRES", "STATUS"])
    if policy is None:
        print("no trusted keys given: values are shown unverified (--trusted-keys to verify)", file=sys.stderr)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    path = Path(args.file)
    fp = fingerprint_of_plan_name(path.name) or fingerprint_of_sig_name(path.name)
    if fp is None:
        raise ConfigError(f"{path.name} is not named startup_plan_<16 hex>.json or .json.sig")
    directory = LocalPlanDir(path.parent)
    plan_bytes, sig_bytes = directory.read(fp)
    if plan_bytes is None and read_capped(path, MAX_PLAN_BYTES) is None:
        raise ConfigError(f"{path} does not exist")
    policy = optional_policy(args)
    report = check(PlanResult(fp, "local", plan_bytes, sig_bytes), policy, utcnow())
    info: dict[str, Any] = {"file": str(directory.path / plan_name(fp)), **report.to_json()}
    if sig_bytes is not None:
        try:
            env = dsse.decode(sig_bytes)
            info["envelope"] = {"payloadType": env.payload_type, "keyids": [s.keyid for s in env.signatures]}
            info["statement"] = _statement_json(env.payload)
        except PlanCacheError as exc:
            info["envelope"] = {"error": f"{exc.reason.value}: {exc.detail}"}
    if args.json:
        print_json(info)
    else:
        for key, value in info.items():
            print(f"{key:24} {safe_text(value, 2000)}")
    return 0 if report.status in ("valid", "unverified") else 1


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
