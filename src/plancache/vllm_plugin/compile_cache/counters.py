"""vLLM's own compilation counters (``vllm.compilation.counter``): what a boot compiled or loaded.

Read by the boot record (whether a verified compile cache was used) and by the evidence signed
with a plan (whether the measuring boot compiled cold, loaded a warm cache, or compiled nothing).
Process-wide counters: a boot's state is the difference between two readings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

COUNTERS = (
    "num_inductor_compiles",
    "num_aot_compiles",
    "num_compiled_artifacts_loaded",
    "num_aot_artifacts_loaded",
)


def counters() -> dict[str, int]:
    """vLLM's own compilation counters (``vllm.compilation.counter``), where readable."""
    try:
        from vllm.compilation.counter import compilation_counter

        return {name: int(getattr(compilation_counter, name)) for name in COUNTERS}
    except Exception:
        return {}


def grew(before: Mapping[str, int], now: Mapping[str, int], *names: str) -> bool:
    """A counter rose since ``before`` (vLLM resets them between compiles: a lower value is a
    reset)."""
    return any(
        now.get(n, 0) > (before.get(n, 0) if now.get(n, 0) >= before.get(n, 0) else 0)
        for n in names
    )


def used_by_counters(item: dict[str, Any]) -> bool | None:
    """For a cache vLLM reads outside the AOT wrapper (the ``<10 hex>`` layout): it compiled
    anyway (inductor or AOT compiles since the decision) or it loaded artifacts; else unknown."""
    before, now = item.get("_counters") or {}, counters()
    if not before or not now:
        return None
    if grew(before, now, "num_inductor_compiles", "num_aot_compiles"):
        return False
    return (
        True
        if grew(before, now, "num_compiled_artifacts_loaded", "num_aot_artifacts_loaded")
        else None
    )


def compile_state(before: Mapping[str, int], now: Mapping[str, int]) -> str | None:
    """``cold`` (inductor or AOT compiles since ``before``), ``warm`` (only artifacts loaded),
    ``none`` (neither), or None when the counters cannot be read."""
    if not now:
        return None
    if grew(before, now, "num_inductor_compiles", "num_aot_compiles"):
        return "cold"
    if grew(before, now, "num_compiled_artifacts_loaded", "num_aot_artifacts_loaded"):
        return "warm"
    return "none"
