"""What the plugin can see of how a boot measured its plan: the evidence signed with it.

Read from vLLM's own objects after ``Worker.determine_available_memory`` profiled: the numbers
vLLM 0.33 leaves on the worker (``total_consumed``, ``peak_activation_memory``,
``cudagraph_memory_estimate``, ``available_kv_cache_memory_bytes``; the weights from
``model_runner.model_memory_usage``), its and torch's versions, and its compilation counters
(:mod:`..compile_cache.counters`) since the boot began: ``cold``, ``warm`` or ``none``. vLLM
does not expose the non-torch memory apart from the weights (``total_consumed`` holds both), nor the
profile's torch peak: they are not signed. Decides nothing; a number that cannot be read is
left out.
"""

from __future__ import annotations

from typing import Any

from ..adapter import byte_count
from ..compile_cache.counters import compile_state, counters

WORKER_NUMBERS = {
    "consumed_memory": "total_consumed",
    "peak_activation_memory": "peak_activation_memory",
    "cudagraph_memory_estimate": "cudagraph_memory_estimate",
    "available_kv_cache_memory": "available_kv_cache_memory_bytes",
}
"""Evidence name -> the worker attribute vLLM 0.33's ``determine_available_memory`` sets."""


def profiling_numbers(worker: object) -> dict[str, int]:
    """vLLM's own profiling numbers on ``worker``, where it set them (non-negative counts)."""
    out: dict[str, int] = {}
    runner = getattr(worker, "model_runner", None)
    weights = byte_count(getattr(runner, "model_memory_usage", None))
    if weights is not None and weights >= 0:
        out["weights_memory"] = weights
    for name, attr in WORKER_NUMBERS.items():
        value = byte_count(getattr(worker, attr, None))
        if value is not None and value >= 0:
            out[name] = value
    return out


def evidence(worker: object, counters_at_start: dict[str, int]) -> dict[str, Any]:
    """The evidence of this boot's measurement: versions, compile state, profiling numbers."""
    facts: dict[str, Any] = {}
    try:
        import torch
        import vllm

        facts["vllm_version"] = str(vllm.__version__)[:200]
        facts["torch_version"] = str(torch.__version__)[:200]
    except Exception:
        pass
    state = compile_state(counters_at_start, counters())
    if state is not None:
        facts["compile"] = state
    facts.update(profiling_numbers(worker))
    return facts


def free_memory_now(worker: object) -> tuple[int | None, int | None]:
    """(free, total) device memory now, read as vLLM's ``MemorySnapshot`` reads it
    (``torch.accelerator.get_memory_info`` on the worker's device); (None, None) if unreadable."""
    try:
        import torch

        free, total = torch.accelerator.get_memory_info(getattr(worker, "device", None))
        return byte_count(free), byte_count(total)
    except Exception:
        return None, None
