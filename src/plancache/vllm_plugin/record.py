"""One structured record per worker boot: what plancache decided, what vLLM then did, what it saved.

Why: the decision lines say a plan was applied or a compile cache verified, not whether vLLM then
used the cache or compiled anyway, nor what the boot saved; a fleet that never hits its shared
cache pays for it and does not notice. So every worker boot leaves one record (schema
:data:`SCHEMA`):

- a JSON file ``$VLLM_CACHE_ROOT/plancache/boot/<time>-<pid>-r<rank>-<id>.json``
  (:mod:`plancache.storage.local.records`: atomic, no link followed, the last 64 kept), rewritten at
  each event of the boot (so a boot that dies half-way still leaves what it knew, ``final``
  false), and
- one log line ``plancache: boot-record {json}`` (INFO; WARNING when a verified compile cache
  went unused) when the boot is over: when ``Worker.compile_or_warm_up_model`` returns.

The record holds the plan's decision and reason (the same strings as the decision line), each
compile-cache decision and whether vLLM then loaded the verified artifacts (``used``: true,
false = "verified but unused", null = not known), the milliseconds the plugin spent, and the
time saved where it can be measured: profiling skipped (the signed plan's ``profile_ms`` minus
this boot's ``determine_available_memory``) and compile skipped (the signed manifest's
``compile_ms`` minus this boot's load). Decides nothing; never raises into vLLM.

A worker's record is kept on the worker object; the process's record in progress (begun by a
compile-cache decision before any worker hook, then taken over by the worker) and the latest
cache-key factors are the boot's, in :class:`.plugin_state.Records`: a forked worker starts its
own.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..clock import REAL_CLOCK
from ..storage.local import records
from ..trust.display import safe_text
from ..trust.inputs import differences
from . import deferred, plugin_state
from .compile_cache.counters import counters as _counters
from .compile_cache.counters import used_by_counters as _used_by_counters
from .deferred import DeferredWrites

LOG = logging.getLogger("vllm.plancache")
SCHEMA = "plancache.boot/v1"


@dataclass
class BootRecord:
    """The record of one worker boot, filled in as the boot goes."""

    root: Path
    rank: int
    worker_id: int | None
    name: str = ""
    started: str = field(
        default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(REAL_CLOCK.wall()))
    )
    world_size: int | None = None
    plan: dict[str, Any] | None = None
    compile_cache: list[dict[str, Any]] = field(default_factory=list)
    plugin_ms: float = 0.0
    saved_ms: dict[str, float | None] = field(
        default_factory=lambda: {"profiling": None, "compile": None}
    )
    final: bool = False
    written: bool = False
    """Whether the file exists yet: its first write prunes the directory, its rewrites do not."""
    pending: DeferredWrites | None = None
    """Its write still in flight on the boot's deferred thread (:mod:`.deferred`)."""
    signed_factors: dict[str, Any] = field(default_factory=dict)
    """Cache -> the verified manifest's key factors (compared at the end, never written whole)."""

    def __post_init__(self) -> None:
        stamp = self.started.replace("-", "").replace(":", "")
        self.name = f"{stamp}-{os.getpid()}-r{max(self.rank, 0)}-{secrets.token_hex(4)}.json"

    def document(self) -> dict[str, Any]:
        warnings = [
            f"compile cache {c['cache']} was verified but vLLM did not use it"
            + (
                f" (differs in {', '.join(d['input'] for d in c['differing_factors'])})"
                if c.get("differing_factors")
                else ""
            )
            for c in self.compile_cache
            if c.get("used") is False
        ] + plan_warnings(self.plan or {})
        return {
            "schema": SCHEMA,
            "time": self.started,
            "pid": os.getpid(),
            "rank": self.rank,
            "world_size": self.world_size,
            "final": self.final,
            "plan": self.plan,
            "compile_cache": [
                {k: v for k, v in c.items() if not k.startswith("_")} for c in self.compile_cache
            ],
            "plugin_ms": round(self.plugin_ms, 1),
            "saved_ms": dict(self.saved_ms),  # a copy: later events set its values in place
            "warnings": warnings,
        }


def _root() -> Path:
    """vLLM's cache root as the plan side reads it (through vLLM's ``startup_plan`` module, as the
    hooks found it: a vLLM that moves ``envs`` behind a shim is followed); without the plan side,
    ``vllm.envs``, as the compile-cache guard reads it (no ``startup_plan`` imported for it)."""
    if plugin_state.current().installed.startup_plan is not None:
        from .adapter import vllm_envs

        return Path(vllm_envs().VLLM_CACHE_ROOT)
    from vllm import envs

    return Path(envs.VLLM_CACHE_ROOT)


ATTR = "_plancache_record"


def for_worker(worker: object) -> BootRecord:
    """This worker's record, begun at its first event (kept on the worker object, like the boot
    state; a compile-cache decision made before it, in the same process, is taken over)."""
    state = plugin_state.current().records
    with state.lock:
        record = getattr(worker, ATTR, None)
        if isinstance(record, BootRecord) and not record.final:
            return record
        rank = getattr(worker, "rank", 0)
        current = state.current
        if current is not None and not current.final and current.worker_id is None:
            record = current  # the compile guard's, of this process: the same boot
            record.rank = rank if isinstance(rank, int) else record.rank
        else:
            record = BootRecord(_root(), rank if isinstance(rank, int) else 0, id(worker))
        record.worker_id = id(worker)
        world = getattr(getattr(worker, "parallel_config", None), "world_size", None)
        record.world_size = world if isinstance(world, int) else None
        try:
            setattr(worker, ATTR, record)
        except Exception:
            pass
        state.current = record
        return record


def _process_record(rank: int) -> BootRecord:
    state = plugin_state.current().records
    with state.lock:
        if state.current is None or state.current.final:
            state.current = BootRecord(_root(), rank, None)
        return state.current


def _write(record: BootRecord, later: list[tuple[str, Callable[[], None]]] | None = None) -> None:
    """Write the record as it is now, after any write of it still in flight (a newer document
    never overwritten by an older one). ``later``: the write is appended there instead, for the
    boot's deferred thread (:mod:`.deferred`), the document taken now and encoded there: it
    holds only values no later event changes in place (:meth:`BootRecord.document`), so its
    bytes are those of this moment wherever they are encoded."""
    deferred.wait(record.pending)
    record.pending = None
    document = record.document()

    def write() -> None:  # prunes until a write of the record succeeds (a full disk frees up)
        data = json.dumps(document, sort_keys=True).encode()
        records.write(record.root, record.name, data, prune=not record.written)
        record.written = True

    if later is not None:
        later.append(("boot record", write))
        return
    try:
        write()
    except Exception as exc:
        LOG.debug(
            "plancache: boot record not written: %s", safe_text(getattr(exc, "detail", exc), 200)
        )


def note_plan(
    worker: object,
    decision: str,
    reason: str,
    source: str,
    fp: str | None,
    detail: str,
    elapsed_ms: float,
    *,
    signed_profile_ms: float | None = None,
    signed_by: list[dict[str, Any]] | None = None,
    facts: Mapping[str, Any] | None = None,
    later: list[tuple[str, Callable[[], None]]] | None = None,
) -> BootRecord:
    """The plan side's decision (the decision line's fields) and ``facts`` the boot knows of its
    plan by then (:func:`note_plan_facts`' kind), written at once: one write (appended to
    ``later`` for the deferred thread, :func:`_write`). Returns the record."""
    record = for_worker(worker)
    with plugin_state.current().records.lock:
        record.plan = {
            "decision": decision,
            "reason": reason,
            "source": source,
            "fingerprint": fp,
            "detail": safe_text(detail, 300),
            "signed_profile_ms": signed_profile_ms,
            "signed_by": signed_by,  # names and key ids; a keyless signer's identity and issuer
            **(facts or {}),
        }
        record.plugin_ms += elapsed_ms
        _write(record, later)
    return record


def plan_warnings(plan: Mapping[str, Any]) -> list[str]:
    """The plan side's alerts (issue 49): a plan held back on this node, a tight margin."""
    out = []
    held = plan.get("held_back")
    if isinstance(held, dict):
        out.append(
            f"plan {held.get('fingerprint')} held back (plan-exceeds-profile): its "
            f"{held.get('plan_kv_cache_memory_bytes')} B exceed this node's profile "
            f"{held.get('profiled_kv_cache_memory_bytes')} B"
        )
    margin = plan.get("margin")
    if isinstance(margin, dict) and margin.get("tight"):
        out.append(f"tight plan: {margin.get('free_bytes')} B free after start-up")
    return out


def note_plan_facts(worker: object, facts: Mapping[str, Any]) -> None:
    """What the boot learnt about its plan after the decision (evidence, the free memory left,
    a comparison with a fresh profile), merged into the plan entry and written at once."""
    record = for_worker(worker)
    with plugin_state.current().records.lock:
        record.plan = {**(record.plan or {}), **facts}
        _write(record)


def note_profiling(worker: object, determine_ms: float) -> float | None:
    """``determine_available_memory`` took ``determine_ms``: the saving against the signed
    profiling time when a plan applied (None otherwise); returns the boot's profiling time
    when it profiled (what a plan saved now would sign)."""
    record = for_worker(worker)
    with plugin_state.current().records.lock:
        plan = record.plan or {}
        if plan.get("decision") == "apply" and plan.get("signed_profile_ms") is not None:
            record.saved_ms["profiling"] = round(
                max(0.0, plan["signed_profile_ms"] - determine_ms), 1
            )
        if record.plan is not None:  # a new entry: a document taken before holds the old one
            record.plan = {**record.plan, "determine_ms": round(determine_ms, 1)}
        _write(record)
    return determine_ms if plan.get("decision") == "profile" else None


def note_compile(
    rank: int,
    entry: Mapping[str, Any],
    elapsed_ms: float,
    key_factors: Mapping[str, Any] | None,
    *,
    compile_ms: float | None = None,
) -> None:
    """A compile-cache decision (``entry``: cache, decision, reason, detail), written at once."""
    record = _process_record(rank)
    with plugin_state.current().records.lock:
        item = {
            **entry,
            "used": None,
            "elapsed_ms": round(elapsed_ms, 1),
            "signed_compile_ms": compile_ms,
            "_counters": _counters() if entry.get("decision") == "load" else {},
        }
        record.compile_cache.append(item)
        if key_factors is not None:
            record.signed_factors[str(entry.get("cache"))] = dict(key_factors)
        record.plugin_ms += elapsed_ms
        _write(record)


def note_used(cache: str, used: bool, load_ms: float | None = None) -> None:
    """Whether vLLM loaded the verified artifacts of ``cache`` (False: it compiled anyway)."""
    state = plugin_state.current().records
    with state.lock:
        record = state.current
        if record is None:
            return
        for item in record.compile_cache:
            if item.get("cache") == cache and item.get("decision") == "load":
                item["used"] = used
                if used and load_ms is not None and item.get("signed_compile_ms") is not None:
                    saved = max(
                        0.0, item["signed_compile_ms"] - load_ms - item.get("elapsed_ms", 0.0)
                    )
                    record.saved_ms["compile"] = round(
                        (record.saved_ms["compile"] or 0.0) + saved, 1
                    )
        _write(record)


def note_factors(factors: Mapping[str, Any] | None) -> None:
    """The factors vLLM wrote for the graph it just compiled (compared with a verified cache's)."""
    if factors is not None:
        state = plugin_state.current().records
        with state.lock:
            state.last_factors = dict(factors)


def last_factors() -> dict[str, Any] | None:
    """The cache-key factors vLLM wrote in this boot's latest compile (a copy), if any."""
    state = plugin_state.current().records
    with state.lock:
        return None if state.last_factors is None else dict(state.last_factors)


def finish(worker: object) -> dict[str, Any] | None:
    """The boot is over: differing factors filled in, the file final, one log line."""
    state = plugin_state.current().records
    with state.lock:
        record = getattr(worker, ATTR, None)
        current = state.current
        if not isinstance(record, BootRecord) and current is not None and current.worker_id is None:
            record = current  # compile-cache decisions only (no plan side): this process's boot
        if not isinstance(record, BootRecord) or record.final:
            return None
        for item in record.compile_cache:
            if item.get("decision") == "load" and item.get("used") is None:
                item["used"] = _used_by_counters(item)
            signed = record.signed_factors.get(str(item.get("cache")))
            last = state.last_factors
            if item.get("used") is False and signed is not None and last is not None:
                item["differing_factors"] = [
                    {k: safe_text(v, 200) if isinstance(v, str) else v for k, v in d.items()}
                    for d in differences(signed, last)[:20]
                ]
        record.final = True
        document = record.document()
        _write(record)
    level = logging.WARNING if document["warnings"] else logging.INFO
    LOG.log(level, "plancache: boot-record %s", json.dumps(document, sort_keys=True))
    return document
