"""The compile-cache guard: vLLM and torch load only bytes that were verified, and only copies.

On with ``PLANCACHE_COMPILE_CACHE`` (independent of ``VLLM_ENABLE_STARTUP_PLAN``). vLLM 0.33
reads its compile cache in two places, both wrapped here, and the guard runs right before each:

- AOT layout (``VLLM_USE_AOT_COMPILE=1``, the default): ``vllm.compilation.decorators.
  _try_load_aot_compiled_fn(model, path)`` with ``path`` = ``…/torch_aot_compile/<hash>/
  rank_<r>_<dp>/model``, after vLLM pointed ``TORCHINDUCTOR_CACHE_DIR`` at ``<hash>/inductor_cache``;
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

With ``PLANCACHE_SIGNING_KEY``, a cache vLLM compiled into an empty private copy is published into
place and signed (:mod:`.publish`). One INFO line per decision:
``plancache: compile-cache decision=load|compile|quarantined reason=… cache=… elapsed_ms=…``.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...trust.display import safe_text
from ...trust.errors import StoreError
from . import boot_headers, decisions, torch_caches
from .publish import LOCK_WAIT_EXTRA, publish, root_and_subject, settings, signer  # noqa: F401 - signer: tests clear it

LOG = logging.getLogger("vllm.plancache")
DECORATORS = "vllm.compilation.decorators"
BACKENDS = "vllm.compilation.backends"
WRAPPER = "vllm.compilation.wrapper"

_lock = threading.RLock()
_patched: list[tuple[Any, str, Any]] = []
_guarded: dict[str, tuple[Path, Any]] = {}
"""Signed directory -> (the private directory vLLM uses instead, the guard's outcome)."""


def private_for(directory: Path, disabled: bool = False) -> tuple[Path | None, Any]:
    """The private directory vLLM must use instead of ``directory`` (guarded once per process;
    the decision logged then), and the guard's outcome (None when nothing was checked). The
    directory is None when nothing at all can be written: vLLM must then read no cache."""
    key = os.path.abspath(directory)
    with _lock:
        if key not in _guarded:
            _decided_at[key] = time.monotonic()
            try:
                _guarded[key] = _check(directory, disabled)
            except Exception as exc:
                into = _empty_private(f"c{len(_guarded)}")
                decisions.log(
                    "compile",
                    "internal-error",
                    str(directory),
                    time.monotonic(),
                    detail="nothing loaded: "
                    + safe_text(
                        getattr(exc, "detail", None) or f"{type(exc).__name__}: {exc}", 200
                    ),
                )
                _guarded[key] = (into, None)
        return _guarded[key]


def _empty_private(name: str) -> Path | None:
    """A fresh empty directory for vLLM: in this process's boot directory, else its cold scratch."""
    try:
        into = torch_caches.private_dir(name)
    except StoreError:
        scratch = torch_caches.scratch_dir()
        into = scratch / name if scratch is not None else None
    try:
        if into is not None:
            into.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return None
    return into


def _check(directory: Path, disabled: bool) -> tuple[Path | None, Any]:
    from ...pipeline.compile_cache.load import guard
    from ...pipeline.resolver import utcnow

    started = time.monotonic()
    name = f"c{len(_guarded)}"
    try:
        into = torch_caches.private_dir(name)
    except StoreError as exc:  # nowhere to hand over a verified copy: vLLM compiles cold
        from ...pipeline.compile_cache.local_caches import CacheOutcome

        _, subject = root_and_subject(directory)
        cold = CacheOutcome(
            subject or str(directory),
            "compile",
            exc.reason.value,
            f"vLLM compiles cold; {exc.detail}",
        )
        decisions.log("compile", cold.reason, cold.subject, started, detail=cold.detail)
        decisions.record(
            directory, "compile", cold.reason, cold.subject, started, cold.detail, cold
        )
        return _empty_private(name), cold
    config = settings()
    root, subject = root_and_subject(directory)
    why = (
        "vllm-cache-disabled"
        if disabled
        else "unmanaged-directory"
        if subject is None
        else "no-trusted-keys"
        if config is None or (config.keyring is None and config.problem == "no trusted keys")
        else ""
    )
    if why:
        into.mkdir(mode=0o700)
        decisions.log(
            "compile",
            why,
            subject or str(directory),
            started,
            detail="vLLM gets an empty private directory",
        )
        decisions.record(
            directory,
            "compile",
            why,
            subject or str(directory),
            started,
            "vLLM gets an empty private directory",
            None,
        )
        return into, None
    pulled: list[bool] = []
    fetch = _fetcher(config, subject, pulled) if config.url and config.keyring is not None else None
    outcome = None
    try:
        outcome = guard(
            root,
            subject,
            config.keyring,
            utcnow(),
            into,
            problem=config.problem,
            fetch=fetch,
            wait=config.timeout + LOCK_WAIT_EXTRA,
        )
    finally:
        if pulled:  # the header fetch started beside the pull: link it, or cancel it
            boot_headers.decided(
                subject,
                outcome is not None and outcome.action == "load",
                getattr(outcome, "reason", "internal-error"),
                archive_sha256=getattr(outcome, "archive_sha256", None) or None,
            )
    extra = (
        f' quarantined_to="{safe_text(outcome.quarantined_to, 300)}"'
        if outcome.quarantined_to
        else ""
    )
    decisions.log(
        outcome.action,
        outcome.reason or "verified",
        subject,
        started,
        detail=outcome.detail,
        extra=extra,
    )
    decisions.record(
        directory,
        outcome.action,
        outcome.reason or "verified",
        subject,
        started,
        outcome.detail,
        outcome,
    )
    return into, outcome


def _fetcher(config: Any, subject: str, pulled: list[bool]) -> Callable[[], tuple[Any, float]]:
    """Opens the store for the guard's pull and starts the header fetch on it at once, beside
    the pull (held: it links nothing before the guard's decision, :func:`boot_headers.decided`)."""

    def fetch() -> tuple[Any, float]:
        from ...storage.store import open_store

        store = open_store(config.url or "", config.storage_options, timeout=config.timeout)
        deadline = time.monotonic() + config.timeout
        pulled.append(True)
        boot_headers.start_fetch(config, subject, store, held=True)  # never raises
        return store, deadline

    return fetch


def _signs_and_pushes() -> bool:
    config = settings()
    return config is not None and bool(config.signing_key and config.url)


def _outside(path: str) -> None:
    """Torch was about to use an inductor cache outside the private tree (vLLM's AOT path with
    ``VLLM_DISABLE_COMPILE_CACHE=1``, a mode without vLLM's cache): one decision line for it."""
    directory = Path(path).parent
    if Path(path).name == "inductor_cache" and os.path.abspath(directory) not in _guarded:
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
    def load(model: Any, aot_compilation_path: str, *args: Any, **kwargs: Any) -> Any:
        signed_rank = Path(aot_compilation_path).parent
        directory = signed_rank.parent
        private, outcome = private_for(directory)
        if (
            private is None
        ):  # nothing can be written: no cache is read, vLLM compiles and saves nothing
            model.__dict__["save_aot_compiled_function"] = lambda: None
            return None
        torch_caches.redirect(directory / "inductor_cache", private / "inductor_cache")
        private_path = private / signed_rank.name / Path(aot_compilation_path).name
        began = time.monotonic()
        loaded = original(model, str(private_path), *args, **kwargs)
        if outcome is not None and outcome.action == "load":
            try:
                from .. import record

                record.note_used(
                    outcome.subject, loaded is not None, (time.monotonic() - began) * 1000
                )
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
                    publish(directory, private, _since(directory))

            model.__dict__["save_aot_compiled_function"] = save_privately
        return loaded

    load.__plancache__ = True  # type: ignore[attr-defined]
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
        self: Any, cache_dir: str, disable_cache: bool = False, prefix: str = ""
    ) -> None:
        local = Path(cache_dir)
        rank_dir = local.parent if prefix else local
        if (
            disable_cache
        ):  # nothing read from cache_dir (also vLLM's own ``dummy_cache`` at AOT loads)
            if _vllm_cache_disabled():
                private_for(rank_dir.parent, disabled=True)  # its decision line
            torch_caches.ensure_private()
            return original(self, cache_dir, disable_cache, prefix)
        private, _ = private_for(rank_dir.parent)
        if private is None:  # nothing can be written: vLLM reads no cache
            return original(self, cache_dir, True, prefix)
        local.mkdir(
            parents=True, exist_ok=True
        )  # vLLM made it (for its debug files); a quarantine took it
        private_local = private / local.relative_to(rank_dir.parent)
        private_local.mkdir(mode=0o700, parents=True, exist_ok=True)
        result = original(self, str(private_local), disable_cache, prefix)
        if not torch_caches.in_a_copy(os.environ.get(torch_caches.INDUCTOR_ENV)):
            # vLLM 0.33's standalone adaptor leaves inductor where it is (its own
            # initialize_inductor_cache runs only when the decorator's flag is off): the copy's
            # rank_<r>_<dp>/inductor_cache, where vLLM would put it, so it is published with it.
            torch_caches.point_inductor(private / rank_dir.name / "inductor_cache")
        return result

    initialize_cache.__plancache__ = True  # type: ignore[attr-defined]
    return initialize_cache


def _publishing_backend_call(original: Callable[..., Any]) -> Callable[..., Any]:
    """Publish ``<10 hex>`` once ``VllmBackend.__call__`` returns, not at ``save_to_file``: vLLM
    writes its cache-key factors after saving, and the signed manifest records them."""

    @functools.wraps(original)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        decisions.note_factors(getattr(self.compilation_config, "local_cache_dir", None))
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
                publish(Path(directory), private, _since(Path(directory)))
        return result

    call.__plancache__ = True  # type: ignore[attr-defined]
    return call


_decided_at: dict[str, float] = {}
"""Signed directory -> when the guard decided (a compile's time runs from there to its publish)."""


def _since(directory: Path) -> float | None:
    started = _decided_at.get(os.path.abspath(directory))
    return None if started is None else (time.monotonic() - started) * 1000


def _private_entry(original: Callable[..., Any]) -> Callable[..., Any]:
    return torch_caches.guarded_call(original, _outside)


def install() -> bool:
    """Wrap vLLM's compile-cache reads and its entries into torch (idempotent), and pin torch's
    caches in this boot's private directory. Never raises: a failure is one ERROR line."""
    import importlib

    with _lock:
        if _patched:
            return True
        try:
            decorators = importlib.import_module(DECORATORS)
            backends = importlib.import_module(BACKENDS)
            wrapper = importlib.import_module(WRAPPER).TorchCompileWithNoGuardsWrapper
            targets = (
                (decorators, "_try_load_aot_compiled_fn", _guarded_aot_load),
                (backends.CompilerManager, "initialize_cache", _guarded_initialize_cache),
                (backends.VllmBackend, "__call__", _publishing_backend_call),
                (wrapper, "aot_compile", _private_entry),
                (wrapper, "__call__", _private_entry),
            )
            for target, name, _ in targets:
                if not callable(getattr(target, name, None)):
                    raise AttributeError(
                        f"{target.__name__}.{name} not found (plancache supports vLLM 0.32 and 0.33)"
                    )
            boot_headers.on_build_node(_signs_and_pushes)
            try:
                torch_caches.boot_dir()
            except StoreError as exc:  # guarded all the same: every cache is then a cold compile
                LOG.warning(
                    "plancache: compile-cache: %s; vLLM compiles cold", safe_text(exc.detail, 600)
                )
            os.register_at_fork(after_in_child=_forget_in_child)
            for target, name, wrap in targets:
                current = getattr(target, name)
                if not getattr(current, "__plancache__", False):
                    _patched.append((target, name, current))
                    setattr(target, name, wrap(current))
        except Exception as exc:
            os.environ["VLLM_DISABLE_COMPILE_CACHE"] = "1"
            torch_caches.switch_off_torch_caches()
            LOG.error(
                "plancache: compile-cache guard not installed (%s); vLLM's compile cache is switched off "
                "(VLLM_DISABLE_COMPILE_CACHE=1): it compiles cold",
                safe_text(exc, 300),
            )
            return False
    return True


def _forget_in_child() -> None:
    """In a process forked from one that guarded (vLLM's engine forks its workers after loading
    the plugin): nothing of the parent's decisions, private copies or locks carries over; the
    child makes its own boot directory on first use (:func:`torch_caches.boot_dir`)."""
    global _lock
    _lock = threading.RLock()
    _guarded.clear()
    _decided_at.clear()
    boot_headers.reset()


def uninstall() -> None:
    with _lock:
        for patched in (_patched, decisions.hooked):
            while patched:
                target, name, original = patched.pop()
                setattr(target, name, original)
