"""The offline subcommands: keygen, sign, verify, ls, inspect."""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..settings import SIGNING_KEY_ENV
from ..storage.files import read_capped
from ..storage.keyfiles import generate_keypair, keyring_from, load_signer
from ..storage.localdir import LocalPlanDir
from ..trust import envelope as dsse
from ..trust.errors import PlanCacheError, Reason
from ..trust.keys import Keyring, Signer, TrustedKey
from ..trust.plan import MAX_PLAN_BYTES, fingerprint_of_plan_name, fingerprint_of_sig_name, plan_name
from ..trust.signing import add_signature, sign_plan
from ..trust.statement import parse_statement
from ..trust.verify import verify_plan
from .locations import DirSource, local_dir, open_source, storage_options
from .output import gib, print_json, print_table
from .report import PlanReport, check_many, check_one, exit_code



def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def require_keyring(args: argparse.Namespace) -> Keyring:
    keyring = keyring_from(args.trusted_keys)
    if keyring is None:
        raise ConfigError("no trusted keys: pass --trusted-keys FILE or set PLANCACHE_TRUSTED_KEYS")
    return keyring.with_threshold(args.threshold)


def signer_from(args: argparse.Namespace) -> Signer:
    ref = args.key or os.environ.get(SIGNING_KEY_ENV)
    if not ref:
        raise ConfigError(f"no signing key: pass --key FILE or set {SIGNING_KEY_ENV}")
    return load_signer(ref)


def own_keyring(signer: Signer) -> Keyring:
    """A keyring that trusts only this signer: "is it already validly signed by me?"."""
    public = getattr(signer, "public", None)
    if public is None:
        return Keyring()
    return Keyring({signer.keyid: TrustedKey(signer.keyid, "self", public)})


def sign_one(
    directory: LocalPlanDir, fp: str, signer: Signer, now: datetime, args: argparse.Namespace
) -> tuple[str, str]:
    """Sign one plan in place; returns (action, detail). Existing valid co-signatures are kept."""
    name = plan_name(fp)
    plan_bytes, sig_bytes = directory.read(fp)
    if plan_bytes is None:
        raise PlanCacheError(Reason.NO_PLAN, "plan file vanished")
    try:
        verify_plan(name, plan_bytes, sig_bytes, own_keyring(signer), now)
        return "kept", "already signed by this key"
    except PlanCacheError:
        pass
    new_sig: bytes | None = None
    action = "signed"
    if sig_bytes is not None:
        try:
            statement = parse_statement(dsse.decode(sig_bytes).payload)
            if statement.expires_at is None or statement.expires_at > now:
                new_sig = add_signature(name, plan_bytes, sig_bytes, signer)
                action = "co-signed"
        except PlanCacheError:
            new_sig = None  # an unusable old sidecar is replaced by a fresh signature
    if new_sig is None:
        expires = now + args.expires_in if args.expires_in else None
        new_sig = sign_plan(name, plan_bytes, signer, now, expires, args.comment, dict(args.fact or []))
    directory.write_sig(fp, new_sig)
    return action, ""


def cmd_keygen(args: argparse.Namespace) -> int:
    signer = generate_keypair(Path(args.path), args.force, args.comment or Path(args.path).name)
    print(f"wrote {args.path} (private, mode 0600) and {args.path}.pub")
    print(f"key id {signer.keyid}")
    return 0


def cmd_sign(args: argparse.Namespace) -> int:
    signer = signer_from(args)
    directory = local_dir(args.dir)
    now = utcnow()
    results: list[dict[str, Any]] = []
    for fp in directory.fingerprints():
        try:
            action, detail = sign_one(directory, fp, signer, now, args)
        except PlanCacheError as exc:
            action, detail = f"refused ({exc.reason.value})", exc.detail
        results.append({"fingerprint": fp, "action": action, "detail": detail})
    failed = sum(r["action"].startswith("refused") for r in results)
    if args.json:
        print_json({"key": signer.keyid, "plans": results})
    else:
        print_table([(r["fingerprint"], r["action"], r["detail"]) for r in results], ["PLAN", "ACTION", "DETAIL"])
        counts = {a: sum(r["action"] == a for r in results) for a in ("signed", "co-signed", "kept")}
        print(
            f"{len(results)} plan(s) in {directory}: {counts['signed']} signed, {counts['co-signed']} co-signed, "
            f"{counts['kept']} already signed, {failed} refused (key {signer.keyid})",
            file=sys.stderr,
        )
    return 1 if failed else 0


def _reports(args: argparse.Namespace, keyring: Keyring | None) -> tuple[object, list[PlanReport]]:
    source = open_source(args.location, storage_options(args), args.timeout)
    fingerprints = source.fingerprints()
    if isinstance(source, DirSource):  # local files: the pool's workers read their own share
        return source, check_many(fingerprints, keyring, utcnow(), jobs=args.jobs, load=source.fetch_items)
    return source, check_many(source.fetch_items(fingerprints), keyring, utcnow(), jobs=args.jobs)


def cmd_verify(args: argparse.Namespace) -> int:
    keyring = require_keyring(args)
    source, reports = _reports(args, keyring)
    if args.json:
        print_json({"location": str(source), "plans": [r.to_json() for r in reports], "ok": exit_code(reports) == 0})
    else:
        rows = [(r.fingerprint, ", ".join(r.signers), r.status, r.reason if r.reason not in ("ok", r.status) else "", r.detail)
                for r in reports]
        print_table(rows, ["PLAN", "SIGNER", "STATUS", "REASON", "DETAIL"])
        bad = sum(r.status != "valid" for r in reports)
        print(f"{len(reports)} plan(s) in {source}: {len(reports) - bad} valid, {bad} not", file=sys.stderr)
    return exit_code(reports)


def cmd_ls(args: argparse.Namespace) -> int:
    keyring = keyring_from(args.trusted_keys)
    source, reports = _reports(args, keyring.with_threshold(args.threshold) if keyring else None)
    if args.json:
        print_json({"location": str(source), "plans": [r.to_json() for r in reports]})
        return 0
    rows = [
        (r.fingerprint, gib(r.kv_cache_memory_bytes), gib(r.free_memory_baseline), ", ".join(r.signers),
         r.signed_at, r.expires_at, r.status if r.status in ("valid", "unverified") else f"{r.status} ({r.reason})")
        for r in reports
    ]
    print_table(rows, ["PLAN", "KV_GIB", "BASELINE_GIB", "SIGNER", "SIGNED_AT", "EXPIRES", "STATUS"])
    if keyring is None:
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
    keyring = keyring_from(args.trusted_keys)
    report = check_one((fp, plan_bytes, sig_bytes), keyring, utcnow())
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
            print(f"{key:24} {value}")
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
        "signed_at": st.signed_at.isoformat(),
        "expires_at": st.expires_at.isoformat() if st.expires_at else None,
        "comment": st.comment,
        "provenance": dict(st.provenance),
    }
