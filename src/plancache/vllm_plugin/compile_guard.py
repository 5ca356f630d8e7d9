"""The compile-cache guard: no byte of an unverified torch.compile cache reaches torch.

On with ``PLANCACHE_COMPILE_CACHE=1`` (independent of ``VLLM_ENABLE_STARTUP_PLAN``). vLLM 0.33
reads its compile cache in two places, both wrapped here, and the guard runs right before each:

- AOT layout (``VLLM_USE_AOT_COMPILE=1``, the default): ``vllm.compilation.decorators.
  _try_load_aot_compiled_fn(model, path)``, a module-level name the decorated module's first
  ``__call__`` looks up; ``path`` is ``…/torch_aot_compile/<hash>/rank_<r>_<dp>/model`` and
  ``TORCHINDUCTOR_CACHE_DIR`` already points at ``<hash>/inductor_cache``. Nothing is read
  during ``load_model``.
- the ``<10 hex>`` layout: ``CompilerManager.initialize_cache(cache_dir, …)`` with
  ``cache_dir`` = ``…/torch_compile_cache/<10 hex>/rank_<r>_<dp>/<prefix>``; it reads
  ``vllm_compile_cache.py`` and later loads the ``artifact_*`` files it names. vLLM reads it under
  ``VLLM_USE_AOT_COMPILE=0`` and on any recompile in the AOT layout (see
  :func:`_guarded_initialize_cache`); its inductor cache would stay in ``$TMPDIR``.

Before either, :func:`plancache.pipeline.compile_cache.guard` verifies the whole cache directory
(signature, closed world, every sha256) under a per-directory lock shared by the node's ranks,
or moves it into ``$VLLM_CACHE_ROOT/plancache-quarantine/``; vLLM then finds no cache and
compiles (or fails, under ``VLLM_FORCE_AOT_LOAD=1``, as it does for a missing cache). A
directory that cannot be moved aside stops the worker: loading it is never the fallback.
With a store and trusted keys, a missing cache is first pulled (verified before extraction).

It also pins what torch would otherwise read from outside the verified directory: inductor's
cache in the ``<10 hex>`` layout (``TORCHINDUCTOR_CACHE_DIR``), its precompiled headers
(``$TMPDIR/torchinductor_<user>/precompiled_headers``, chosen when torch is imported) and
``TRITON_CACHE_DIR`` (unless the operator set it) go inside the ``inductor_cache/`` in use.

With ``PLANCACHE_SIGNING_KEY``, a cache vLLM has just saved is signed (and pushed in the
background when ``PLANCACHE_URL`` is set; the interpreter waits for the push at exit). One INFO
line per decision:
``plancache: compile-cache decision=load|compile|quarantined reason=… cache=… elapsed_ms=…``.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..trust.display import safe_text

LOG = logging.getLogger("vllm.plancache")
DECORATORS = "vllm.compilation.decorators"
BACKENDS = "vllm.compilation.backends"

_lock = threading.RLock()
_patched: list[tuple[Any, str, Any]] = []
_pinned_triton: str | None = None
_pushes: list[threading.Thread] = []


@dataclass(frozen=True)
class Settings:
    """The environment, read once per process: trust, signing, store."""

    keyring: Any
    """A Keyring; None with ``problem`` set when keys are named but unusable."""
    problem: str
    signing_key: str | None
    url: str | None
    storage_options: Any
    timeout: float


@functools.lru_cache(maxsize=1)
def settings() -> Settings | None:
    """None when no trusted keys are configured: the guard then leaves vLLM's own behaviour."""
    from ..pipeline.trust_config import worker_policy
    from .config import parse_config

    config = parse_config()
    for error in config.errors:
        LOG.error("plancache: compile-cache: %s", error)
    policy = worker_policy(config.trusted_keys, config.threshold) if config.trusted_keys else None
    if policy is None and not config.signing_key:
        return None
    return Settings(
        keyring=policy.keyring if policy is not None else None,
        problem=policy.problem if policy is not None else "no trusted keys",
        signing_key=config.signing_key,
        url=config.url,
        storage_options=config.storage_options,
        timeout=config.timeout,
    )


@functools.lru_cache(maxsize=1)
def signer() -> Any:
    """The signing key, loaded when a new cache is first signed, never at boot (a KMS or HSM key
    costs network calls a warm boot has no use for); None, with one ERROR line, if unusable."""
    config = settings()
    if config is None or not config.signing_key:
        return None
    from ..pipeline.trust_config import signer_for

    try:
        return signer_for(config.signing_key)
    except Exception as exc:  # noqa: BLE001 - one ERROR line; caches are then left unsigned
        LOG.error("plancache: compile-cache: signing key unusable (%s); new caches stay unsigned", safe_text(exc, 200))
        return None


def _root_and_subject(directory: Path) -> tuple[Any, str | None]:
    from ..pipeline.compile_cache import CacheRoot

    parts = directory.parts
    base = Path(*parts[: -3 if directory.parent.name == "torch_aot_compile" else -2])
    root = CacheRoot(base)
    return root, root.subject_of(directory)


def check(directory: Path) -> Any:
    """Guard one cache directory; log the decision; the outcome (None if nothing was checked)."""
    from ..pipeline.compile_cache import guard, has_cache, pull_cache
    from ..pipeline.resolver import utcnow

    started = time.monotonic()
    config = settings()
    root, subject = _root_and_subject(directory)
    if config is None or subject is None or (config.keyring is None and config.problem == "no trusted keys"):
        why = "unmanaged-directory" if subject is None else "no-trusted-keys"
        LOG.info("plancache: compile-cache decision=skip reason=%s cache=%s", why, safe_text(directory, 200))
        return None
    note = ""
    if config.url and config.keyring is not None and not has_cache(root, subject):
        note = _pull(root, subject, config, pull_cache, utcnow)
    outcome = guard(root, subject, config.keyring, utcnow(), config.problem)
    extra = f' quarantined_to="{safe_text(outcome.quarantined_to, 300)}"' if outcome.quarantined_to else ""
    detail = "; ".join(x for x in (outcome.detail, note) if x)
    LOG.info('plancache: compile-cache decision=%s reason=%s cache=%s elapsed_ms=%.0f%s detail="%s"', outcome.action,
             outcome.reason or "verified", subject, (time.monotonic() - started) * 1000, extra, safe_text(detail, 300))
    return outcome


def enforce(directory: Path) -> None:
    """:func:`check`, failing closed: if the directory can be neither verified nor moved aside
    (or plancache itself fails), the worker stops rather than let torch read it."""
    try:
        check(directory)
    except Exception as exc:  # noqa: BLE001
        LOG.error("plancache: compile-cache decision=refuse cache=%s detail=\"%s\"", safe_text(directory, 200),
                  safe_text(getattr(exc, "detail", exc), 300))
        raise RuntimeError(f"plancache: compile cache {directory} can be neither verified nor moved aside") from exc


def _pull(root: Any, subject: str, config: Settings, pull_cache: Callable[..., Any], clock: Callable[[], Any]) -> str:
    try:
        from ..storage.store import open_store

        store = open_store(config.url or "", config.storage_options, timeout=config.timeout)
        return f"store: {pull_cache(store, root, subject, config.keyring, clock()).action}"
    except Exception as exc:  # noqa: BLE001 - a failed pull costs a compile, nothing more
        return f"store: {safe_text(getattr(exc, 'detail', exc), 200)}"


def _pin(inductor: Path) -> None:
    """Point torch's other on-disk caches inside the guarded ``inductor_cache`` (see the module doc)."""
    global _pinned_triton
    inductor.mkdir(parents=True, exist_ok=True)
    try:
        from torch._inductor import codecache

        codecache._HEADER_DIR = str(inductor / "precompiled_headers")
        codecache._HEADER_LOCK_DIR = str(inductor / "precompiled_headers" / "locks")
    except Exception:  # noqa: BLE001 - a torch without them has nothing to pin
        LOG.debug("plancache: precompiled headers not pinned", exc_info=True)
    current = os.environ.get("TRITON_CACHE_DIR")
    if current is None or current == _pinned_triton:
        _pinned_triton = os.environ["TRITON_CACHE_DIR"] = str(inductor / "triton")


def sign_saved(directory: Path) -> None:
    """After vLLM saved a new cache in ``directory``: sign it, push it in the background."""
    config, key = settings(), signer()
    if config is None or key is None:
        return
    from ..pipeline.compile_cache import push_cache, sign_cache
    from ..pipeline.resolver import utcnow
    from ..trust.keys import signer_keyring

    root, subject = _root_and_subject(directory)
    if subject is None:
        return
    try:
        sign_cache(root, subject, key, utcnow())
    except Exception as exc:  # noqa: BLE001
        LOG.warning("plancache: compile cache %s not signed: %s", subject, safe_text(getattr(exc, "detail", exc), 300))
        return
    if not config.url:
        return

    def push() -> None:
        from ..settings import BULK_TIMEOUT
        from ..storage.store import open_store

        started = time.monotonic()
        try:  # an archive of tens to hundreds of MiB: the bulk deadline, not the boot's
            store = open_store(config.url or "", config.storage_options, timeout=max(config.timeout, BULK_TIMEOUT))
            push_cache(store, root, subject, signer_keyring(key), utcnow())
            LOG.debug("plancache: pushed compile cache %s to %s in %.0f ms", subject, safe_text(config.url, 200),
                     (time.monotonic() - started) * 1000)
        except Exception as exc:  # noqa: BLE001 - a failed push costs the next node a compile
            LOG.warning("plancache: push of compile cache %s failed: %s", subject, safe_text(getattr(exc, "detail", exc), 300))

    thread = threading.Thread(target=push, name="plancache-compile-push", daemon=True)
    with _lock:
        if not _pushes:
            # threading's exit hooks run in reverse order of registration, before the executors
            # the store's IO runs on refuse new work ("cannot schedule new futures after
            # shutdown"); a plain atexit hook would run too late.
            getattr(threading, "_register_atexit", atexit.register)(_finish_pushes)
        _pushes.append(thread)
    thread.start()


def _finish_pushes() -> None:
    """At interpreter exit, let started pushes finish (each is bounded by its store deadline).
    A daemon thread alone would die with a short-lived process, and a one-shot warm-up boot,
    whose whole point is to fill the store, would push nothing."""
    for thread in list(_pushes):
        thread.join()


def _guarded_aot_load(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def load(model: Any, aot_compilation_path: str, *args: Any, **kwargs: Any) -> Any:
        directory = Path(aot_compilation_path).parent.parent
        enforce(directory)
        _pin(directory / "inductor_cache")  # vLLM made it before asking; a quarantine took it along
        loaded = original(model, aot_compilation_path, *args, **kwargs)
        if loaded is None:  # vLLM compiles next, then saves: sign what it saved
            save = model.save_aot_compiled_function

            def save_and_sign() -> None:
                save()
                sign_saved(directory)

            model.__dict__["save_aot_compiled_function"] = save_and_sign
        return loaded

    load.__plancache__ = True  # type: ignore[attr-defined]
    return load


def _guarded_initialize_cache(original: Callable[..., Any]) -> Callable[..., Any]:
    """``CompilerManager.initialize_cache`` reads ``<10 hex>/rank_<r>_<dp>/<prefix>/
    vllm_compile_cache.py`` and then loads the artifacts it names whenever the manager's
    ``use_aot_compile`` is set, which is the *decorator's* flag (true for every
    ``@support_torch_compile`` model), not ``VLLM_USE_AOT_COMPILE``: so this layout is read
    under ``VLLM_USE_AOT_COMPILE=0`` and on any recompile in the AOT layout. Guard it always."""

    @functools.wraps(original)
    def initialize_cache(self: Any, cache_dir: str, disable_cache: bool = False, prefix: str = "") -> None:
        if not disable_cache:
            local = Path(cache_dir)
            rank_dir = local.parent if prefix else local
            enforce(rank_dir.parent)
            local.mkdir(parents=True, exist_ok=True)
            _pin_inductor(rank_dir)
        return original(self, cache_dir, disable_cache, prefix)

    initialize_cache.__plancache__ = True  # type: ignore[attr-defined]
    return initialize_cache


def _pin_inductor(rank_dir: Path) -> None:
    """Inductor's own cache must lie inside a guarded directory. The AOT path already points
    ``TORCHINDUCTOR_CACHE_DIR`` at ``torch_aot_compile/<hash>/inductor_cache`` (kept); otherwise
    vLLM 0.33's standalone adaptor leaves it at torch's default ``$TMPDIR/torchinductor_<user>``,
    which nothing verifies, so it goes to ``<10 hex>/rank_<r>_<dp>/inductor_cache`` (where vLLM's
    own ``initialize_inductor_cache`` would put it), overriding a value as vLLM's AOT path does."""
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    compile_root = os.path.abspath(rank_dir.parent.parent)
    if current is None or not os.path.abspath(current).startswith(compile_root + os.sep):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = current = str(rank_dir / "inductor_cache")
    _pin(Path(current))


def _signing_backend_call(original: Callable[..., Any]) -> Callable[..., Any]:
    """Sign ``<10 hex>`` once ``VllmBackend.__call__`` returns, not at ``save_to_file``: vLLM
    writes ``computation_graph.py`` after saving, and an unsigned file there fails the next boot."""

    @functools.wraps(original)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        manager = getattr(self, "compiler_manager", None)
        path = getattr(manager, "cache_file_path", None)
        if (manager is not None and not getattr(manager, "disable_cache", True) and manager.is_cache_updated
                and path and os.path.exists(path) and self.compilation_config.cache_dir):
            sign_saved(Path(self.compilation_config.cache_dir))
        return result

    call.__plancache__ = True  # type: ignore[attr-defined]
    return call


def install() -> bool:
    """Wrap vLLM's two compile-cache reads (idempotent). Never raises: a failure is one ERROR."""
    import importlib

    with _lock:
        if _patched:
            return True
        try:
            decorators = importlib.import_module(DECORATORS)
            backends = importlib.import_module(BACKENDS)
            targets = ((decorators, "_try_load_aot_compiled_fn", _guarded_aot_load),
                       (backends.CompilerManager, "initialize_cache", _guarded_initialize_cache),
                       (backends.VllmBackend, "__call__", _signing_backend_call))
            for target, name, _ in targets:
                if not callable(getattr(target, name, None)):
                    raise AttributeError(f"{target.__name__}.{name} not found (plancache supports vLLM 0.33)")
            for target, name, wrap in targets:
                current = getattr(target, name)
                if not getattr(current, "__plancache__", False):
                    _patched.append((target, name, current))
                    setattr(target, name, wrap(current))
        except Exception as exc:  # noqa: BLE001 - a plugin must never break vLLM's start
            LOG.error("plancache: compile-cache guard not installed (%s); vLLM reads its compile cache unchecked",
                      safe_text(exc, 300))
            return False
    return True


def uninstall() -> None:
    with _lock:
        while _patched:
            target, name, original = _patched.pop()
            setattr(target, name, original)
