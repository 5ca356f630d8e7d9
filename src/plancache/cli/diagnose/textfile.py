"""Boot records as a node exporter textfile: the fleet view with the tools fleets already run.

Why this format: every Kubernetes or bare-metal fleet that runs Prometheus runs node_exporter,
whose textfile collector reads ``*.prom`` files from one directory
(``--collector.textfile.directory``). ``plancache doctor --textfile DIR/plancache.prom`` turns the
last record of each rank on this node into gauges, written atomically (the collector never sees
half a file), so a dashboard or an alert can say "this pool never applies a plan" or "a verified
compile cache went unused on 40 nodes" without shipping logs. Labels carry only reason codes and
decisions (a bounded set), never details, so the series count stays small.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

METRICS = (
    ("plancache_boot_timestamp_seconds", "Unix time of the last boot record of this rank."),
    ("plancache_boot_plan_applied", "1 when the last boot of this rank applied a verified plan, else 0."),
    ("plancache_boot_compile_cache_loaded", "Compile caches the last boot of this rank verified and vLLM loaded."),
    ("plancache_boot_compile_cache_unused", "Compile caches verified but not used by vLLM in the last boot (it compiled)."),
    ("plancache_boot_compile_cache_missed", "Compile-cache reads in the last boot that found no usable cache."),
    ("plancache_boot_plugin_seconds", "Time plancache spent in the last boot of this rank."),
    ("plancache_boot_saved_seconds", "Boot time saved in the last boot of this rank, by what was skipped."),
    ("plancache_boot_decision", "The last boot's decisions of this rank (always 1; the labels say which)."),
)


def _label(value: object) -> str:
    """A label value in the text format: backslash, double quote and newline escaped, bounded."""
    text = str(value)[:120]
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _epoch(stamp: object) -> float | None:
    from datetime import datetime, timezone

    try:
        return datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def render(records: Iterable[dict[str, Any]]) -> str:
    """Gauges from the newest record of each rank (``records`` newest first, as doctor reads them)."""
    latest: dict[int, dict[str, Any]] = {}
    for doc in records:
        rank = doc.get("rank")
        if isinstance(rank, int) and rank not in latest:
            latest[rank] = doc
    samples: dict[str, list[str]] = {name: [] for name, _ in METRICS}
    for rank, doc in sorted(latest.items()):
        base = f'rank="{rank}"'
        plan = doc.get("plan") if isinstance(doc.get("plan"), dict) else {}
        caches = [c for c in doc.get("compile_cache") or [] if isinstance(c, dict)]
        saved = doc.get("saved_ms") if isinstance(doc.get("saved_ms"), dict) else {}
        when = _epoch(doc.get("time"))
        if when is not None:
            samples["plancache_boot_timestamp_seconds"].append(f"{{{base}}} {when:.0f}")
        samples["plancache_boot_plan_applied"].append(f"{{{base}}} {1 if plan.get('decision') == 'apply' else 0}")
        loaded = sum(c.get("decision") == "load" and c.get("used") is not False for c in caches)
        unused = sum(c.get("decision") == "load" and c.get("used") is False for c in caches)
        samples["plancache_boot_compile_cache_loaded"].append(f"{{{base}}} {loaded}")
        samples["plancache_boot_compile_cache_unused"].append(f"{{{base}}} {unused}")
        samples["plancache_boot_compile_cache_missed"].append(f"{{{base}}} {sum(c.get('decision') != 'load' for c in caches)}")
        plugin_ms = doc.get("plugin_ms")
        if isinstance(plugin_ms, (int, float)):
            samples["plancache_boot_plugin_seconds"].append(f"{{{base}}} {plugin_ms / 1000:.3f}")
        for kind in ("profiling", "compile"):
            value = saved.get(kind)
            if isinstance(value, (int, float)):
                samples["plancache_boot_saved_seconds"].append(f'{{{base},kind="{kind}"}} {value / 1000:.3f}')
        compile_reason = caches[0].get("reason", "") if caches else ""
        samples["plancache_boot_decision"].append(
            f'{{{base},plan_decision="{_label(plan.get("decision", ""))}",plan_reason="{_label(plan.get("reason", ""))}",'
            f'compile_decision="{_label(caches[0].get("decision", "") if caches else "")}",'
            f'compile_reason="{_label(compile_reason)}"}} 1')
    lines = []
    for name, help_text in METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"] + [name + s for s in samples[name]]
    return "\n".join(lines) + "\n"


def write(path: str, records: Iterable[dict[str, Any]]) -> None:
    """Replace ``path`` atomically (node_exporter reads whole files or none)."""
    from ...storage.local.files import write_atomic

    write_atomic(Path(path), render(records).encode("utf-8"))
