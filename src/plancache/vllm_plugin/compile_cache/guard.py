"""The compile-cache guard: vLLM and torch load only bytes that were verified, and only copies.

On with ``PLANCACHE_COMPILE_CACHE`` (independent of ``VLLM_ENABLE_STARTUP_PLAN``). vLLM 0.33
reads its compile cache in two places, both wrapped here, and the guard runs right before each:

- AOT layout (``VLLM_USE_AOT_COMPILE=1``, the default): ``vllm.compilation.decorators.
  _try_load_aot_compiled_fn(model, path)`` with ``path`` = ``…/torch_aot_compile/<hash>/
  rank_<r>_<dp>/model``, after vLLM pointed ``TORCHINDUCTOR_CACHE_DIR`` at
  ``<hash>/inductor_cache``;
- the ``<10 hex>`` layout: ``CompilerManager.initialize_cache(cache_dir, …)`` with ``cache_dir`` =
  ``…/torch_compile_cache/<10 hex>/rank_<r>_<dp>/<prefix>`` (read under ``VLLM_USE_AOT_COMPILE=0``
  and on any recompile in the AOT layout).

At either, :func:`plancache.pipeline.compile_cache.load.guard` (under the node's lock for the
directory: one rank pulls, the others wait and verify) verifies the signed directory and copies
it into this boot's private directory, hashing what it writes; vLLM gets the *copy's* path and
inductor the copy's ``inductor_cache``. A cache that fails is moved aside and vLLM gets an empty
private directory (it compiles, or fails under ``VLLM_FORCE_AOT_LOAD=1`` as for a missing
cache). Whatever vLLM and torch write afterwards lands in the copy; the signed directory stays
as it was signed, so the next boot loads it again with no store request. The other caches torch
reads are pinned in the private directory too (:mod:`.torch_caches`), and vLLM's entries into
torch (``TorchCompileWithNoGuardsWrapper.aot_compile`` / ``__call__``) re-point inductor there
whatever vLLM set, so ``VLLM_DISABLE_COMPILE_CACHE=1``, a ``compilation_config.cache_dir``
outside the root and every compile mode are covered, each with its decision line.

With ``PLANCACHE_SIGNING_KEY``, a cache vLLM compiled into an empty private copy is published
into place and signed (:mod:`.publish`). One INFO line per decision:
``plancache: compile-cache decision=load|compile|quarantined reason=… cache=… elapsed_ms=…``.

This module is where the guard meets vLLM: the wrappers, which turn vLLM's arguments into a
signed directory and back, and their install. The decision each of them asks for, once a boot
per directory, is :mod:`.guarded_dirs`'; the settings it reads, :mod:`.guard_settings`'.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ...clock import Stopwatch
from ...trust.display import safe_text
from ...trust.errors import StoreError
from .. import plugin_state
from . import torch_caches
from .decisions import note_factors
from .guarded_dirs import private_for, since, was_guarded
from .publish import publish

LOG = logging.getLogger("vllm.plancache")
DECORATORS = "vllm.compilation.decorators"
BACKENDS = "vllm.compilation.backends"
WRAPPER = "vllm.compilation.wrapper"


class AotModel(Protocol):
    """The model vLLM's ``_try_load_aot_compiled_fn`` loads into, as the guard touches it: its
    save is replaced (on the instance) by one into the private copy."""

    __dict__: dict[str, Any]
    _aot_compilation_path: str
    _aot_cache_dir: str

    def save_aot_compiled_function(self) -> None: ...


class CompilationConfig(Protocol):
    cache_dir: str
    """The ``<10 hex>`` cache directory vLLM compiled into ("" before it chose one)."""


class Backend(Protocol):
    """vLLM's ``VllmBackend`` after a compile, as the publish reads it (its ``compiler_manager``
    and the config's ``local_cache_dir`` are probed, not promised)."""

    compilation_config: CompilationConfig


def _outside(path: str) -> None:
    """Torch was about to use an inductor cache outside the private tree (vLLM's AOT path with
    ``VLLM_DISABLE_COMPILE_CACHE=1``, a mode without vLLM's cache): one decision line for it."""
    directory = Path(path).parent
    if Path(path).name == "inductor_cache" and not was_guarded(directory):
        private, _ = private_for(directory, disabled=_vllm_cache_disabled())
        if private is not None:
            torch_caches.redirect(Path(path), private / "inductor_cache")


def _vllm_cache_disabled() -> bool:
    try:
        from vllm import envs

        return bool(envs.VLLM_DISABLE_COMPILE_CACHE)
    except Exception:
        return False


def _guarded_aot_load(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def load(model: AotModel, aot_compilation_path: str, *args: object, **kwargs: object) -> Any:
        signed_rank = Path(aot_compilation_path).parent
        directory = signed_rank.parent
        private, outcome = private_for(directory)
        if private is None:  # nothing can be written: no cache read, vLLM compiles and saves none
            model.__dict__["save_aot_compiled_function"] = lambda: None
            return None
        torch_caches.redirect(directory / "inductor_cache", private / "inductor_cache")
        private_path = private / signed_rank.name / Path(aot_compilation_path).name
        began = Stopwatch.started()
        loaded = original(model, str(private_path), *args, **kwargs)
        if outcome is not None and outcome.action == "load":
            try:
                from .. import record

                record.note_used(outcome.subject, loaded is not None, began.elapsed_ms())
            except Exception:
                LOG.debug("plancache: boot record not updated", exc_info=True)
        if loaded is None:  # vLLM compiles next, then saves: into the private copy, then published
            save = model.save_aot_compiled_function

            def save_privately() -> None:
                model._aot_compilation_path, model._aot_cache_dir = (
                    str(private_path),
                    str(private_path.parent),
                )
                save()
                if (
                    outcome is None or outcome.action != "load"
                ) and torch_caches.has_private_place():
                    publish(directory, private, since(directory))

            model.__dict__["save_aot_compiled_function"] = save_privately
        return loaded

    plugin_state.mark(load)
    return load


def _guarded_initialize_cache(original: Callable[..., Any]) -> Callable[..., Any]:
    """``CompilerManager.initialize_cache`` reads ``<10 hex>/rank_<r>_<dp>/<prefix>/
    vllm_compile_cache.py`` and then loads the artifacts it names whenever the manager's
    ``use_aot_compile`` is set, which is the *decorator's* flag (true for every
    ``@support_torch_compile`` model), not ``VLLM_USE_AOT_COMPILE``: so this layout is read
    under ``VLLM_USE_AOT_COMPILE=0`` and on any recompile in the AOT layout. Guard it always;
    vLLM gets the private copy's ``rank_<r>_<dp>/<prefix>`` (its debug files, which it never
    reads, still go to the shared directory: never signed, never copied, never loaded)."""

    @functools.wraps(original)
    def initialize_cache(
        self: object, cache_dir: str, disable_cache: bool = False, prefix: str = ""
    ) -> None:
        local = Path(cache_dir)
        rank_dir = local.parent if prefix else local
        if disable_cache:  # nothing read from cache_dir (also vLLM's ``dummy_cache`` at AOT loads)
            if _vllm_cache_disabled():
                private_for(rank_dir.parent, disabled=True)  # its decision line
            torch_caches.ensure_private()
            return original(self, cache_dir, disable_cache, prefix)
        private, _ = private_for(rank_dir.parent)
        if private is None:  # nothing can be written: vLLM reads no cache
            return original(self, cache_dir, True, prefix)
        # vLLM made it (for its debug files); a quarantine took it
        local.mkdir(parents=True, exist_ok=True)
        private_local = private / local.relative_to(rank_dir.parent)
        private_local.mkdir(mode=0o700, parents=True, exist_ok=True)
        result = original(self, str(private_local), disable_cache, prefix)
        if not torch_caches.in_a_copy(os.environ.get(torch_caches.INDUCTOR_ENV)):
            # vLLM 0.33's standalone adaptor leaves inductor where it is (its own
            # initialize_inductor_cache runs only when the decorator's flag is off): the copy's
            # rank_<r>_<dp>/inductor_cache, where vLLM would put it, so it is published with it.
            torch_caches.point_inductor(private / rank_dir.name / "inductor_cache")
        return result

    plugin_state.mark(initialize_cache)
    return initialize_cache


def _publishing_backend_call(original: Callable[..., Any]) -> Callable[..., Any]:
    """Publish ``<10 hex>`` once ``VllmBackend.__call__`` returns, not at ``save_to_file``: vLLM
    writes its cache-key factors after saving, and the signed manifest records them."""

    @functools.wraps(original)
    def call(self: Backend, *args: object, **kwargs: object) -> Any:
        result = original(self, *args, **kwargs)
        note_factors(getattr(self.compilation_config, "local_cache_dir", None))
        manager = getattr(self, "compiler_manager", None)
        path = getattr(manager, "cache_file_path", None)
        directory = self.compilation_config.cache_dir
        if (
            manager is not None
            and not getattr(manager, "disable_cache", True)
            and manager.is_cache_updated
            and path
            and os.path.exists(path)
            and directory
        ):
            private, outcome = private_for(Path(directory))
            if (
                outcome is not None
                and outcome.action != "load"
                and private is not None
                and torch_caches.has_private_place()
            ):
                publish(Path(directory), private, since(Path(directory)))
        return result

    plugin_state.mark(call)
    return call


def _private_entry(original: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's compiled call, in this process's private directory; with nowhere to compile
    into, the model's own ``forward`` (eager)."""
    return torch_caches.guarded_call(original, _outside, _forward)


def _private_aot_compile(original: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's AOT compile, in this process's private directory; with nowhere to compile into,
    a function that runs the model's ``forward`` (vLLM calls it as ``fn(model, *args)``)."""
    return torch_caches.guarded_call(original, _outside, lambda model, *_, **__: _forward)


def _forward(model: Any, *args: object, **kwargs: object) -> Any:
    return model.forward(*args, **kwargs)


def install() -> bool:
    """Wrap vLLM's compile-cache reads and its entries into torch (idempotent), and pin torch's
    caches in this boot's private directory. Never raises: a failure is one ERROR line, and
    vLLM's compile cache is then switched off (it compiles cold)."""
    state = plugin_state.current()
    with state.lock:
        if state.installed.guard_patches:
            return True
        problem: object = None  # what stopped it: a message, or the exception itself
        try:
            targets = _targets()
            problem = next(
                (
                    f"{target.__name__}.{name} not found (plancache supports vLLM 0.32 and 0.33)"
                    for target, name, _ in targets
                    if not callable(getattr(target, name, None))
                ),
                None,
            )
            if problem is None:
                _pin_torch()
                for target, name, wrap in targets:
                    current = getattr(target, name)
                    if not plugin_state.marked(current):
                        state.installed.guard_patches.append((target, name, current))
                        setattr(target, name, wrap(current))
        except Exception as exc:
            problem = exc
        if problem is not None:
            os.environ["VLLM_DISABLE_COMPILE_CACHE"] = "1"
            torch_caches.switch_off_torch_caches()
            LOG.error(
                "plancache: compile-cache guard not installed (%s); vLLM's compile cache is "
                "switched off (VLLM_DISABLE_COMPILE_CACHE=1): it compiles cold, with torch's "
                "caches pinned in this process's private directory",
                safe_text(problem, 300),
            )
            # vLLM unwrapped still points inductor at its shared ``<hash>/inductor_cache``, where
            # torch would reuse any kernel module found at its name: torch's own cache_dir is
            # pinned (or refuses) all the same
            try:
                _pin_torch()
            except Exception:
                LOG.debug("plancache: torch's caches not pinned", exc_info=True)
            return False
    return True


Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


def _targets() -> tuple[tuple[Any, str, Wrap], ...]:
    """vLLM's objects the guard wraps (their modules imported now): (owner, name, wrapper)."""
    import importlib

    decorators = importlib.import_module(DECORATORS)
    backends = importlib.import_module(BACKENDS)
    wrapper = importlib.import_module(WRAPPER).TorchCompileWithNoGuardsWrapper
    return (
        (decorators, "_try_load_aot_compiled_fn", _guarded_aot_load),
        (backends.CompilerManager, "initialize_cache", _guarded_initialize_cache),
        (backends.VllmBackend, "__call__", _publishing_backend_call),
        (wrapper, "aot_compile", _private_aot_compile),
        (wrapper, "__call__", _private_entry),
    )


def _pin_torch() -> None:
    """This process's private directory made, torch's caches pinned in it; without one, the
    guard is installed all the same and every cache is a cold compile."""
    try:
        torch_caches.boot_dir()
    except StoreError as exc:
        LOG.warning("plancache: compile-cache: %s; vLLM compiles cold", safe_text(exc.detail, 600))


def uninstall() -> None:
    """Put vLLM's and the worker's originals back (tests, or a process that wants the guard out)."""
    state = plugin_state.current()
    with state.lock:
        for patched in (state.installed.guard_patches, state.installed.warm_up_patches):
            while patched:
                target, name, original = patched.pop()
                setattr(target, name, original)
