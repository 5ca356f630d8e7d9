"""Where the plugin touches vLLM: three names, replaced only if they look like vLLM 0.33's.

- ``vllm.v1.worker.startup_plan.maybe_apply_startup_plan`` and ``maybe_save_startup_plan``
  are replaced by :func:`apply_hook` / :func:`save_hook`. ``gpu_worker`` imports both names
  with ``from … import …`` at module level, so patching ``startup_plan`` *before* ``gpu_worker``
  is imported is enough (this is the order in a worker: plugins load in
  ``WorkerWrapperBase.init_worker``, then the worker class is imported). If ``gpu_worker``
  is already imported, its two names are replaced too.
- ``Worker.load_model`` is wrapped to start the store prefetch while the weights load. The
  class lives in ``gpu_worker``, which the plugin does not import (it is heavy, and not every
  process that loads plugins runs a worker): a meta-path hook patches it right after vLLM
  imports the module.

If vLLM's internals are not where 0.33 has them, one WARNING is logged and nothing is patched.
:func:`uninstall` restores every original (tests rely on it).
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import inspect
import logging
import sys
import threading
from types import ModuleType
from typing import Any, Callable

LOG = logging.getLogger("vllm.plancache")

STARTUP_PLAN = "vllm.v1.worker.startup_plan"
GPU_WORKER = "vllm.v1.worker.gpu_worker"

_lock = threading.RLock()
_originals: dict[str, Callable[..., Any]] = {}
"""vLLM's functions that the hooks replaced: 'apply', 'save', 'fingerprint', 'load_model'."""
_finder: "_GpuWorkerFinder | None" = None
_warned = False


def _warn_once(message: str, *args: object) -> None:
    global _warned
    if not _warned:
        _warned = True
        LOG.warning("plancache: " + message + "; plugin inactive, vLLM runs unchanged", *args)


def _params(func: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(func).parameters)


def _check_startup_plan(module: ModuleType) -> str | None:
    """What is missing from vLLM's startup_plan module, or None if it is shaped like 0.33's."""
    for name in ("compute_plan_fingerprint", "maybe_apply_startup_plan", "maybe_save_startup_plan", "_plan_path"):
        if not callable(getattr(module, name, None)):
            return f"{STARTUP_PLAN}.{name} not found"
    if getattr(module, "PLAN_SCHEMA_VERSION", None) != 1:
        return f"{STARTUP_PLAN}.PLAN_SCHEMA_VERSION is {getattr(module, 'PLAN_SCHEMA_VERSION', None)!r}, not 1"
    expected = {
        "compute_plan_fingerprint": ["vllm_config", "rank", "world_size"],
        "maybe_apply_startup_plan": ["worker"],
        "maybe_save_startup_plan": ["worker", "kv_cache_memory_bytes"],
    }
    for name, params in expected.items():
        func = getattr(module, name)
        if getattr(func, "__plancache__", False):
            func = inspect.unwrap(func)
        if _params(func) != params:
            return f"{STARTUP_PLAN}.{name}{inspect.signature(func)} has an unexpected signature"
    return None


def apply_hook(worker: Any) -> None:
    """Replaces vLLM's ``maybe_apply_startup_plan``."""
    try:
        from . import boot

        boot.apply(worker, _originals["fingerprint"])
    except Exception:  # noqa: BLE001 - never into vLLM; it profiles as usual
        LOG.exception("plancache: unexpected error while applying a plan; vLLM profiles as usual")


def save_hook(worker: Any, kv_cache_memory_bytes: int) -> None:
    """Replaces vLLM's ``maybe_save_startup_plan``."""
    try:
        from . import save

        save.save(worker, kv_cache_memory_bytes, _originals["fingerprint"], _originals["save"])
    except Exception:  # noqa: BLE001
        LOG.exception("plancache: unexpected error while saving a plan")


apply_hook.__plancache__ = True  # type: ignore[attr-defined]
save_hook.__plancache__ = True  # type: ignore[attr-defined]


def _prefetch(worker: Any) -> None:
    try:
        from . import boot

        boot.prefetch(worker, _originals["fingerprint"])
    except Exception:  # noqa: BLE001
        LOG.debug("plancache: prefetch not started", exc_info=True)


def _wrap_load_model(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        _prefetch(self)
        return original(self, *args, **kwargs)

    load_model.__plancache__ = True  # type: ignore[attr-defined]
    return load_model


def _patch_gpu_worker(module: ModuleType) -> None:
    """Replace the two names ``gpu_worker`` imported and wrap ``Worker.load_model``."""
    with _lock:
        if not _originals:
            return
        for name, key, hook in (
            ("maybe_apply_startup_plan", "apply", apply_hook),
            ("maybe_save_startup_plan", "save", save_hook),
        ):
            current = getattr(module, name, None)
            if current is _originals[key]:
                setattr(module, name, hook)
            elif current is not hook:
                LOG.warning("plancache: %s.%s is not vLLM's (another plugin?); left as it is", GPU_WORKER, name)
        worker_cls = getattr(module, "Worker", None)
        load_model = getattr(worker_cls, "load_model", None) if worker_cls is not None else None
        if callable(load_model) and not getattr(load_model, "__plancache__", False):
            _originals["load_model"] = load_model
            worker_cls.load_model = _wrap_load_model(load_model)  # type: ignore[union-attr]


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then patches the module. Other attributes pass through."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        try:
            _patch_gpu_worker(module)
        except Exception:  # noqa: BLE001
            LOG.warning("plancache: could not hook %s; no prefetch", GPU_WORKER, exc_info=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _GpuWorkerFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the other finders for ``gpu_worker`` and wraps its loader."""

    def __init__(self) -> None:
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != GPU_WORKER or getattr(self._busy, "on", False):
            return None  # not ours, or re-entered by another finder that also asks around
        self._busy.on = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _PatchingLoader(spec.loader)
                    return spec
            return None
        finally:
            self._busy.on = False


def install() -> bool:
    """Patch vLLM (idempotent). False, after one WARNING, if vLLM is not shaped like 0.33."""
    global _finder
    with _lock:
        if _originals:
            gpu_worker = sys.modules.get(GPU_WORKER)
            if gpu_worker is not None:
                _patch_gpu_worker(gpu_worker)
            return True
        try:
            module = importlib.import_module(STARTUP_PLAN)
        except Exception as exc:  # noqa: BLE001 - ImportError, or vLLM failing to import
            _warn_once("cannot import %s (%s: %s)", STARTUP_PLAN, type(exc).__name__, exc)
            return False
        problem = _check_startup_plan(module)
        if problem is not None:
            _warn_once("%s (plancache supports vLLM 0.33)", problem)
            return False
        if getattr(module.maybe_apply_startup_plan, "__plancache__", False):
            return True  # patched by another copy of this module; leave it
        _originals.update(
            apply=module.maybe_apply_startup_plan,
            save=module.maybe_save_startup_plan,
            fingerprint=module.compute_plan_fingerprint,
        )
        module.maybe_apply_startup_plan = apply_hook
        module.maybe_save_startup_plan = save_hook
        gpu_worker = sys.modules.get(GPU_WORKER)
        if gpu_worker is not None:
            _patch_gpu_worker(gpu_worker)
        elif _finder is None:
            _finder = _GpuWorkerFinder()
            sys.meta_path.insert(0, _finder)
        return True


def uninstall() -> None:
    """Restore vLLM's originals everywhere the hooks put themselves."""
    global _finder
    with _lock:
        if _finder is not None:
            try:
                sys.meta_path.remove(_finder)
            except ValueError:
                pass
            _finder = None
        if not _originals:
            return
        module = sys.modules.get(STARTUP_PLAN)
        gpu_worker = sys.modules.get(GPU_WORKER)
        for target in (module, gpu_worker):
            if target is None:
                continue
            if getattr(target, "maybe_apply_startup_plan", None) is apply_hook:
                target.maybe_apply_startup_plan = _originals["apply"]
            if getattr(target, "maybe_save_startup_plan", None) is save_hook:
                target.maybe_save_startup_plan = _originals["save"]
        worker_cls = getattr(gpu_worker, "Worker", None) if gpu_worker is not None else None
        if worker_cls is not None and "load_model" in _originals:
            if getattr(worker_cls.__dict__.get("load_model"), "__plancache__", False):
                worker_cls.load_model = _originals["load_model"]
        _originals.clear()


def installed() -> bool:
    return bool(_originals)
