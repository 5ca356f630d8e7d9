"""The boot records the plugin left on this node, read for ``doctor``: the last few as a check,
and for ``--textfile`` every rank's newest.

Apart from the set-up checks (:mod:`.setup_checks`) because these say what workers *did* (their
plan and compile-cache decisions, whether vLLM used a verified cache, time saved), read from
files under the cache root rather than from the environment; the gauges they become are
:mod:`.textfile`'s.
"""

from __future__ import annotations

import sys
from typing import Any

from ...trust.errors import PlanCacheError
from .setup_checks import Checks


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
