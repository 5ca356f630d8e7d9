"""Boot records as a node exporter textfile: the fleet view with the tools fleets already run.

Why this format: every Kubernetes or bare-metal fleet that runs Prometheus runs node_exporter,
whose textfile collector reads ``*.prom`` files from one directory
(``--collector.textfile.directory``). ``plancache doctor --textfile DIR/plancache.prom`` turns the
last record of each rank on this node into gauges, written atomically (the collector never sees
half a file), so a dashboard or an alert can say "this pool never applies a plan" or "a verified
compile cache went unused on 40 nodes" without shipping logs. Labels carry only reason codes and
decisions of the documented set (anything else is ``other``), never details nor a string a record
holds, so the series count stays small and a planted record cannot write labels. A record is
this node's own file but still input: :func:`problem` says why one is passed over (wrong types,
lone surrogates, nesting), and every rank's newest good record is exported, however many ranks.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ...trust.errors import Reason
from ...trust.plans.gate import Verdict
from ...trust.plans.plan import is_fingerprint

METRICS = (
    ("plancache_boot_timestamp_seconds", "Unix time of the last boot record of this rank."),
    (
        "plancache_boot_plan_applied",
        "1 when the last boot of this rank applied a verified plan, else 0.",
    ),
    (
        "plancache_boot_compile_cache_loaded",
        "Compile caches the last boot of this rank verified and vLLM loaded.",
    ),
    (
        "plancache_boot_compile_cache_unused",
        "Compile caches verified but not used by vLLM in the last boot (it compiled).",
    ),
    (
        "plancache_boot_compile_cache_missed",
        "Compile-cache reads in the last boot that found no usable cache.",
    ),
    ("plancache_boot_plugin_seconds", "Time plancache spent in the last boot of this rank."),
    (
        "plancache_boot_saved_seconds",
        "Boot time saved in the last boot of this rank, by what was skipped.",
    ),
    (
        "plancache_boot_decision",
        "The last boot's decisions of this rank (always 1; the labels say which).",
    ),
    (
        "plancache_boot_plan_held_back_bytes",
        "A plan this rank's node held back (plan-exceeds-profile): its KV and the fresh profile.",
    ),
    (
        "plancache_boot_free_after_startup_bytes",
        "Free device memory at the end of the last boot's start-up, after applying a plan.",
    ),
    (
        "plancache_boot_plan_tight",
        "1 when that free memory was below the documented threshold (2 % of the device), else 0.",
    ),
)


PLAN_DECISIONS = frozenset({"apply", "profile", "skip"})
"""The plan side's decisions (docs/vllm-plugin.md, docs/commands.md: ``decision=skip``)."""
PLAN_REASONS = frozenset(r.value for r in Reason) | frozenset(v.value for v in Verdict)
"""Rejection reasons and the gate's verdicts (docs/commands.md, "Rejection reasons")."""
COMPILE_DECISIONS = frozenset({"load", "compile", "quarantined", "refuse"})
"""The compile-cache guard's decisions (docs/compile-cache.md; ``refuse`` from older versions)."""
COMPILE_REASONS = frozenset(r.value for r in Reason) | frozenset(
    {
        "verified",
        "no-cache",
        "store-rejected",
        "vllm-cache-disabled",
        "unmanaged-directory",
        "no-trusted-keys",
        "backoff",
    }
)
"""Rejection reasons and the guard's own outcomes (the table of docs/compile-cache.md)."""
OTHER = "other"

MAX_RANK = 1 << 20
MAX_DEPTH = 16
"""Deeper than any record the plugin writes (5 levels): a deeper one was not written by it."""
_SURROGATE = re.compile("[\ud800-\udfff]")


def _label(value: object, known: frozenset[str]) -> str:
    """A label value from the documented set: "" when absent, ``other`` for anything else (the
    known values are ``[a-z-]`` only, so nothing needs escaping)."""
    if value is None or value == "":
        return ""
    return value if isinstance(value, str) and value in known else OTHER


def _number(value: object) -> bool:
    """A finite JSON number a gauge can carry (a bool is not one; 1e400 parses as inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) <= 2**53 if isinstance(value, int) else math.isfinite(value)


def _shape(doc: object) -> str:
    """The first problem of the whole document ("" if none): a string with a lone surrogate
    (UTF-8 cannot write it: the textfile and the table would fail), or nesting past
    :data:`MAX_DEPTH`. Walked without recursion."""
    stack: list[tuple[object, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels"
        if isinstance(value, dict):
            stack += [(k, depth) for k in value] + [(v, depth + 1) for v in value.values()]
        elif isinstance(value, list):
            stack += [(v, depth + 1) for v in value]
        elif isinstance(value, str) and _SURROGATE.search(value):
            return "a string with a lone surrogate"
    return ""


_STR, _NUM, _BOOL, _INT, _DICT, _LIST = "string", "number", "boolean", "integer", "object", "list"
_TYPES: dict[str, Callable[[object], bool]] = {
    _STR: lambda v: isinstance(v, str),
    _NUM: _number,
    _BOOL: lambda v: isinstance(v, bool),
    _INT: lambda v: isinstance(v, int) and not isinstance(v, bool) and _number(v),
    _DICT: lambda v: isinstance(v, dict),
    _LIST: lambda v: isinstance(v, list),
}
_RECORD = {
    "schema": _STR,
    "time": _STR,
    "pid": _INT,
    "world_size": _INT,
    "final": _BOOL,
    "plan": _DICT,
    "compile_cache": _LIST,
    "plugin_ms": _NUM,
    "saved_ms": _DICT,
    "warnings": _LIST,
}
_PLAN = {
    "decision": _STR,
    "reason": _STR,
    "source": _STR,
    "fingerprint": _STR,
    "detail": _STR,
    "signed_profile_ms": _NUM,
    "determine_ms": _NUM,
    "held_back": _DICT,
    "margin": _DICT,
}
_CACHE = {
    "cache": _STR,
    "decision": _STR,
    "reason": _STR,
    "detail": _STR,
    "used": _BOOL,
    "elapsed_ms": _NUM,
    "signed_compile_ms": _NUM,
    "differing_factors": _LIST,
}
"""The boot record's fields (``vllm_plugin/record.py``) and their types; each may be null."""


def _fields(where: str, doc: dict[str, Any], types: dict[str, str]) -> str:
    for key, kind in types.items():
        value = doc.get(key)
        if value is not None and not _TYPES[kind](value):
            return f"{where}{key} is not a {kind}"
    return ""


def problem(doc: object) -> str:
    """Why a boot record is not one (""  when it is): every field the views read has its type,
    ``rank`` is a rank number; doctor skips such a record with a warning, never an error."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    rank = doc.get("rank")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < MAX_RANK:
        return "rank is not a rank number"
    why = _shape(doc) or _fields("", doc, _RECORD) or _fields("plan.", doc.get("plan") or {}, _PLAN)
    if why:  # the types below hold only now
        return why
    for item in doc.get("compile_cache") or []:
        why = why or (
            "compile_cache holds a non-object"
            if not isinstance(item, dict)
            else _fields("compile_cache[].", item, _CACHE)
        )
    saved = doc.get("saved_ms") or {}
    why = why or next(
        (
            f"saved_ms.{k} is not a number"
            for k in ("profiling", "compile")
            if saved.get(k) is not None and not _number(saved[k])
        ),
        "",
    )
    return why or next(
        (
            "warnings holds a non-string"
            for w in doc.get("warnings") or []
            if not isinstance(w, str)
        ),
        "",
    )


def _epoch(stamp: object) -> float | None:
    from datetime import datetime, timezone

    try:
        return (
            datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ")
            .replace(tzinfo=timezone.utc)
            .timestamp()
        )
    except ValueError:
        return None


def _plan_health(samples: dict[str, list[str]], base: str, plan: dict[str, Any]) -> None:
    """Issue 49's alerts: a plan held back (its fingerprint, checked to be one, is the only
    label from the record), the free memory left after applying and whether it is tight."""
    held = found if isinstance(found := plan.get("held_back"), dict) else {}
    fp = held.get("fingerprint")
    if is_fingerprint(fp):
        for kind, key in (
            ("plan", "plan_kv_cache_memory_bytes"),
            ("profiled", "profiled_kv_cache_memory_bytes"),
        ):
            if _number(value := held.get(key)):
                samples["plancache_boot_plan_held_back_bytes"].append(
                    f'{{{base},fingerprint="{fp}",kind="{kind}"}} {value}'
                )
    margin = found if isinstance(found := plan.get("margin"), dict) else {}
    if _number(free := margin.get("free_bytes")):
        samples["plancache_boot_free_after_startup_bytes"].append(f"{{{base}}} {free}")
        samples["plancache_boot_plan_tight"].append(
            f"{{{base}}} {1 if margin.get('tight') is True else 0}"
        )


def render(records: Iterable[dict[str, Any]]) -> str:
    """Gauges from the newest record of each rank (``records`` newest first, as doctor reads
    them); a record :func:`problem` refuses is passed over (doctor has said so already)."""
    latest: dict[int, dict[str, Any]] = {}
    for doc in records:
        if not problem(doc) and doc["rank"] not in latest:
            latest[doc["rank"]] = doc
    samples: dict[str, list[str]] = {name: [] for name, _ in METRICS}
    for rank, doc in sorted(latest.items()):
        base = f'rank="{rank}"'
        plan = found if isinstance(found := doc.get("plan"), dict) else {}
        caches = [c for c in doc.get("compile_cache") or [] if isinstance(c, dict)]
        saved = found if isinstance(found := doc.get("saved_ms"), dict) else {}
        when = _epoch(doc.get("time"))
        if when is not None:
            samples["plancache_boot_timestamp_seconds"].append(f"{{{base}}} {when:.0f}")
        samples["plancache_boot_plan_applied"].append(
            f"{{{base}}} {1 if plan.get('decision') == 'apply' else 0}"
        )
        loaded = sum(c.get("decision") == "load" and c.get("used") is not False for c in caches)
        unused = sum(c.get("decision") == "load" and c.get("used") is False for c in caches)
        samples["plancache_boot_compile_cache_loaded"].append(f"{{{base}}} {loaded}")
        samples["plancache_boot_compile_cache_unused"].append(f"{{{base}}} {unused}")
        samples["plancache_boot_compile_cache_missed"].append(
            f"{{{base}}} {sum(c.get('decision') != 'load' for c in caches)}"
        )
        plugin_ms = doc.get("plugin_ms")
        if isinstance(plugin_ms, (int, float)):
            samples["plancache_boot_plugin_seconds"].append(f"{{{base}}} {plugin_ms / 1000:.3f}")
        for kind in ("profiling", "compile"):
            value = saved.get(kind)
            if isinstance(value, (int, float)):
                samples["plancache_boot_saved_seconds"].append(
                    f'{{{base},kind="{kind}"}} {value / 1000:.3f}'
                )
        _plan_health(samples, base, plan)
        first = caches[0] if caches else {}
        samples["plancache_boot_decision"].append(
            f'{{{base},plan_decision="{_label(plan.get("decision"), PLAN_DECISIONS)}",'
            f'plan_reason="{_label(plan.get("reason"), PLAN_REASONS)}",'
            f'compile_decision="{_label(first.get("decision"), COMPILE_DECISIONS)}",'
            f'compile_reason="{_label(first.get("reason"), COMPILE_REASONS)}"}} 1'
        )
    lines = []
    for name, help_text in METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"] + [
            name + s for s in samples[name]
        ]
    return "\n".join(lines) + "\n"


def write(path: str, records: Iterable[dict[str, Any]]) -> None:
    """Replace ``path`` atomically (node_exporter reads whole files or none)."""
    from ...storage.local.files import write_atomic

    write_atomic(Path(path), render(records).encode("utf-8"))
