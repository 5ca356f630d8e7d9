"""The vLLM module the plugin reads vLLM through: ``startup_plan``, as :mod:`.hooks` found it.

What vLLM itself reads in ``startup_plan`` (its ``envs`` and ``current_platform`` globals) the
plugin reads through that module too, so a vLLM that moves those behind compatibility shims
(lazy ``__getattr__`` delegates, ``sys.modules`` aliases) still gives the plugin the same
switch, cache root and device facts as vLLM's own code. Its own module, below both
:mod:`.hooks` (which records what it found at install) and :mod:`.adapter` (which reads it),
so that neither imports the other.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

STARTUP_PLAN = "vllm.v1.worker.startup_plan"
WORKER_MODULES: dict[str, str] = {
    "vllm.v1.worker.gpu_worker": "Worker",
    "vllm_ascend.worker.worker": "NPUWorker",
}
"""Modules that import the startup-plan functions by name -> their worker class (the hooks
patch them; the adapter asks whether a worker runs vLLM's startup-plan path)."""

_found: ModuleType | None = None
"""The startup_plan module object the hooks were installed on, else None."""


def remember(module: ModuleType | None) -> None:
    """Record the module :func:`.hooks.install` patched (None at uninstall)."""
    global _found
    _found = module


def found() -> ModuleType | None:
    """The startup_plan module the hooks were installed on, or None (not installed)."""
    return _found


def startup_plan_module() -> ModuleType:
    """vLLM's startup_plan module, as found at install (imported now if the plugin is not installed)."""
    return _found if _found is not None else importlib.import_module(STARTUP_PLAN)


def vllm_envs() -> Any:
    """The ``envs`` vLLM's startup_plan reads its switch and cache root from."""
    return startup_plan_module().envs


def platform() -> Any:
    """The ``current_platform`` vLLM's startup_plan asks for device facts."""
    return startup_plan_module().current_platform
