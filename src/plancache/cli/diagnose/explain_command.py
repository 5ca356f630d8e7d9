"""``plancache explain``: per rank, would this node use a stored plan and compile cache, and if
not, why.

Why: a fleet whose nodes all miss the shared cache pays for it and saves nothing, and a miss
looks like any boot. This command takes this node's vLLM configuration exactly as
``plancache fingerprint`` does (the same code: :func:`.fingerprint.configure`) and a store URL
or plan directory, verifies what is there (only signed, verified statements and manifests are
compared: an unsigned claim is not evidence) and prints, per rank, the plan and compile-cache
decision a worker would reach and, for a miss, the nearest candidates with exactly the inputs
that differ (:mod:`plancache.pipeline.explain`). Exit 0 when every rank would use a plan (and a
compile cache, when caches were looked at), 1 on a miss, 2 on errors.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...trust.display import safe_text
from ...trust.errors import ConfigError
from ..flag_objects import required_policy, storage_options
from ..output import print_table, report

if TYPE_CHECKING:
    from ...pipeline.explain import CacheCandidate
    from ...pipeline.locations import Location
    from ...trust.keyring.keys import Keyring

EXIT_MISS = 1


def _compile_root(args: argparse.Namespace) -> Path | None:
    """Where local compile caches are: ``--compile-root``, else the cache root above a plan
    directory named ``startup_plan`` (vLLM's layout), else none are looked at."""
    if args.compile_root:
        return Path(args.compile_root).expanduser()
    location = Path(args.location).expanduser()
    return location.parent if location.name == "startup_plan" else None


def _caches(
    args: argparse.Namespace, source: Location, keyring: Keyring, now: datetime
) -> tuple[list[CacheCandidate] | None, str | None]:
    from ...clock import Deadline
    from ...pipeline.compile_cache.local_caches import CacheRoot
    from ...pipeline.explain import caches_in_root, caches_in_store
    from ...storage.local.localdir import LocalPlanDir

    if not isinstance(source, LocalPlanDir):
        deadline = Deadline.after(source.timeout, source.clock)
        return caches_in_store(source, keyring, now, deadline), str(args.location)
    root = _compile_root(args)
    if root is None:
        return None, None
    if not root.is_dir():
        raise ConfigError(f"compile-cache root {root} does not exist")
    return caches_in_root(CacheRoot(root), keyring, now), str(root)


def _differs(items: list[dict[str, Any]]) -> str:
    return "; ".join(
        f"{d['input']}: signed {safe_text(d['signed'], 60)!s}, here {safe_text(d['here'], 60)!s}"
        for d in items[:6]
    ) + (f" (+{len(items) - 6} more)" if len(items) > 6 else "")


def evidence_text(evidence: Any) -> str:
    """A plan's signed evidence on one line (``none`` when it was signed without)."""
    if not isinstance(evidence, dict) or not evidence:
        return "none"
    return ", ".join(f"{k}={safe_text(v, 60)}" for k, v in sorted(evidence.items()))


def _print(result: dict[str, Any]) -> None:
    rows = []
    for entry in result["ranks"]:
        plan, cache = entry["plan"], entry["compile_cache"]
        rows.append(
            (
                entry["rank"],
                entry["fingerprint"],
                f"{plan['decision']} ({plan['reason']})",
                f"{cache['decision']} ({cache['reason']})" if cache else "not looked at",
            )
        )
    print_table(rows, ["RANK", "FINGERPRINT", "PLAN", "COMPILE CACHE"])
    for entry in result["ranks"]:
        plan, cache = entry["plan"], entry["compile_cache"]
        print(
            f"rank {entry['rank']}: plan: {plan['detail']}"
            + (f"; differs: {_differs(plan['differs'])}" if plan["differs"] else "")
        )
        if "evidence" in plan:
            print(f"    evidence: {evidence_text(plan['evidence'])}")
        for c in plan["candidates"]:
            signers = ", ".join(c["signers"]) or "?"
            print(
                f"    nearest plan {c['fingerprint']} (signed by {signers}): "
                f"{_differs(c['differs'])}"
            )
        skipped = plan["not_compared"]
        if any(skipped.values()):
            print(
                f"    not compared: {skipped['unverified']} plan(s) that do not verify, "
                f"{skipped['without_inputs']} verified without signed inputs"
            )
        if cache:
            print(
                f"rank {entry['rank']}: compile cache: {cache['detail']}"
                + (f" ({cache['cache']})" if cache.get("cache") else "")
            )
            for c in cache["candidates"]:
                print(
                    f"    nearest cache {c['cache']}: {_differs(c['differs']) or 'same factors'}"
                    + ("" if c["has_rank"] else f" (no artifacts for rank {entry['rank']})")
                )
            skipped = cache["not_compared"]
            if any(skipped.values()):
                print(
                    f"    not compared: {skipped['unverified']} cache(s) that do not verify, "
                    f"{skipped['without_factors']} verified without signed factors"
                )


def _options_after_location(args: argparse.Namespace) -> None:
    """``explain DIR --json -- MODEL``: argparse hands everything after DIR to the serve
    arguments; options before ``--`` are parsed again as this command's."""
    serve = list(args.serve_args)
    cut = serve.index("--") if "--" in serve else 0
    if cut > 0:
        from ..parser import build_parser

        again = build_parser().parse_args(["explain", *serve[:cut], args.location, *serve[cut:]])
        vars(args).update(vars(again))


def run(args: argparse.Namespace) -> int:
    _options_after_location(args)
    from ...pipeline.audit import audit_location
    from ...pipeline.explain import NodeRank, explain_compile, explain_plan
    from ...pipeline.resolver import utcnow
    from ...vllm_plugin.adapter import compile_factors, config_parts
    from .fingerprint import configure

    policy = required_policy(args)  # verify before comparing: nothing unsigned is evidence
    node, cfg = configure(args)
    util = getattr(cfg.cache_config, "gpu_memory_utilization", None)
    here = compile_factors(cfg)
    now = utcnow()
    source, reports = audit_location(
        args.location, policy, now, storage_options=storage_options(args), timeout=args.timeout
    )
    keyring = policy.keyring
    assert keyring is not None  # required_policy's policy is the signed one, keys and all
    caches, cache_location = _caches(args, source, keyring, now)
    ranks: list[dict[str, Any]] = []
    for entry in node["ranks"]:
        factors = entry["factors"]
        conditions = {
            "gpu_memory_utilization": float(util) if isinstance(util, (int, float)) else None,
            "device_name": factors.get("device_name"),
            "device_total_memory": factors.get("device_total_memory"),
        }
        rank = NodeRank(entry["rank"], entry["fingerprint"], factors, conditions, config_parts(cfg))
        ranks.append(
            {
                "rank": rank.rank,
                "fingerprint": rank.fingerprint,
                "plan": explain_plan(rank, reports),
                "compile_cache": None
                if caches is None
                else explain_compile(rank.rank, here, caches),
            }
        )
    ok = all(
        r["plan"]["decision"] == "apply"
        and (r["compile_cache"] is None or r["compile_cache"]["decision"] == "load")
        for r in ranks
    )
    result = {
        "location": str(args.location),
        "compile_location": cache_location,
        "model": node["model"],
        "world_size": node["world_size"],
        "ranks": ranks,
    }
    if args.json:
        report(args, ok, **result)
    else:
        _print(result)
        verdict = (
            "every rank would use what is stored" if ok else "a worker here would miss (see above)"
        )
        print(f"explain: {verdict}", file=sys.stderr)
    return 0 if ok else EXIT_MISS
