"""Every on-disk cache torch 2.13 reads during a guarded boot lies in a private per-process
directory.

With the guard on, each process gets its own boot directory
(:mod:`plancache.storage.compile_cache.boot_dirs`: ``boot-<random>`` in a private root this user
owns, on a filesystem where shared objects can be mapped, alive by a lock), removed at exit. A
worker vLLM forks from the engine process (which loaded the plugin) makes its own on first use:
the directory belongs to the pid that made it (it is the boot's state,
:class:`..plugin_state.Place`, which a fork starts afresh), and nothing of the parent's is used
in the child. From the sources of torch 2.13
and vLLM 0.33, the caches read from disk in any compile mode are:

- ``cache_dir()`` = ``$TORCHINDUCTOR_CACHE_DIR`` (else ``$TMPDIR/torchinductor_<user>``):
  ``fxgraph/`` (FX graph cache, pickles), ``aotautograd/`` (AOTAutograd cache, pickles), the
  kernel modules and libraries (``<2 chars>/*.py|.so``, imported and dlopened), ``cache/`` (local
  autotune), ``dynamo/`` (automatic-dynamic PGO profiles), ``gcc/``, ``autoheuristic/``;
- ``default_cache_dir()`` = ``$TMPDIR/torchinductor_<user>`` whatever the variable says:
  ``precompiled_headers/`` (``codecache._HEADER_DIR``, fixed when torch is imported; kept in
  the private root's ``headers``, see :func:`node_headers`), the on-disk caches of
  ``torch._inductor.cache`` and ``runtime/caching``, Halide's runtime;
- ``$TRITON_CACHE_DIR`` (else ``~/.triton/cache``): Triton kernels;
- vLLM's own directories, which the guard hands over as private copies.

So ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` point into the boot directory, every
``default_cache_dir`` binding torch holds is replaced by one returning ``<boot>/default`` (the
precompiled header included), and :func:`ensure_private` runs before every compile or compiled
call vLLM makes: vLLM's AOT path sets ``TORCHINDUCTOR_CACHE_DIR`` to the *signed*
``<hash>/inductor_cache`` right before it compiles, which is re-pointed at the private copy (or,
when nothing was guarded, at a fresh private directory). Where no private directory can be had
at all, :func:`boot_dir` raises ``no-private-dir``: the guard then makes vLLM compile cold into
a scratch directory (:func:`scratch_dir`, every cache above pinned in it too) and torch's on-disk
caches are switched off, so no cache is ever read unverified; with not even a scratch directory
(every temporary directory full, read-only or ``noexec``), torch compiles nothing and the model
runs eagerly (its cache directories answer :data:`NOWHERE`). Torch's own
``cache_dir`` bindings are replaced as ``default_cache_dir``'s are: whatever sets
``TORCHINDUCTOR_CACHE_DIR`` outside this process's directory (vLLM unwrapped, on a version the
guard does not support), torch is re-pointed before it reads, because it reuses any kernel
module found at its content-hash name. What stays outside is named in SECURITY.md
(``torch._dynamo``'s precompile cache, off by default, fixed at import).
"""

from __future__ import annotations

import logging
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...storage.compile_cache.boot_dirs import PRIVATE_DIR_ENV
from ...trust.errors import StoreError
from .. import plugin_state

LOG = logging.getLogger("vllm.plancache")
INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_ENV = "TRITON_CACHE_DIR"


def boot_dir() -> Path:
    """This process's private directory (made, and the torch caches pinned, on first use in
    each process: it lives in the boot's state, :class:`..plugin_state.Place`, which a forked
    worker starts afresh).

    Raises:
        StoreError: ``no-private-dir``: none can be had (every try after the first raises the
            same, without looking again).
    """
    place = plugin_state.current().place
    if place.boot is None and place.problem is None:
        from vllm import envs

        from ...storage.compile_cache.boot_dirs import new_boot_dir

        try:
            place.boot = new_boot_dir(Path(envs.VLLM_CACHE_ROOT))
        except StoreError as exc:
            place.problem = exc
            _pin_nowhere()
            raise
        place.boot.close_at_exit()
        if place.boot.passed_over:  # an operator should know why the cache root's own was not used
            LOG.info(
                'plancache: compile-cache private directory=%s detail="not used: %s"',
                place.boot.path,
                "; ".join(place.boot.passed_over),
            )
        else:
            LOG.debug("plancache: compile-cache private directory %s", place.boot.path)
        _pin(place.boot.path, place.boot.root)
    if place.boot is None:
        assert place.problem is not None
        raise place.problem
    return place.boot.path


def scratch_dir() -> Path | None:
    """Where vLLM compiles cold when no private directory can be had
    (:func:`plancache.storage.compile_cache.boot_dirs.new_scratch_dir`: ``noexec`` allowed, as
    nothing verified is ever loaded from it; swept like a boot directory), removed at exit;
    None when nothing at all can be written."""
    from ...storage.compile_cache.boot_dirs import new_scratch_dir

    place = plugin_state.current().place
    if place.scratch is None and not place.no_scratch:
        try:
            place.scratch = new_scratch_dir()
        except StoreError:
            place.no_scratch = True  # asked once: nothing at all can be written here
            return None
        place.scratch.close_at_exit()
    return place.scratch.path if place.scratch is not None else None


def has_private_place() -> bool:
    """Whether this process has a boot directory (not just a cold scratch): only then is what
    vLLM compiled into it published and signed."""
    try:
        boot_dir()
    except StoreError:
        return False
    return True


def _pin_nowhere() -> None:
    """No private directory: vLLM compiles into a fresh scratch directory (inductor, Triton and
    the precompiled header all in it), torch's own on-disk caches off. Without even a scratch
    directory torch compiles nothing (:func:`compile_nothing`, an ERROR line: the model runs
    eagerly) and its cache directories answer :data:`NOWHERE`, never a shared path."""
    scratch = scratch_dir()
    if scratch is not None:
        _pin(scratch, None)
    else:
        _pin_bindings()
        try:
            _pin_headers(Path(NOWHERE) / "precompiled_headers")
        except Exception:
            LOG.debug("plancache: torch's precompiled headers not pinned", exc_info=True)
        compile_nothing()
        LOG.error(
            "plancache: compile-cache decision=compile reason=no-private-dir "
            'detail="no private or scratch directory can be made: torch compiles nothing in '
            "this process, the model runs eagerly (set %s to a directory of this user's on an "
            'exec-capable filesystem)"',
            PRIVATE_DIR_ENV,
        )
    switch_off_torch_caches()


def compile_nothing() -> None:
    """torch.compile a no-op in this process (``torch._dynamo.config.disable``, as
    ``TORCH_COMPILE_DISABLE=1``): with nowhere to compile into, the model runs eagerly. Raising
    from torch's cache directory instead would break the boot: ``torch.compile`` itself asks
    for it (its bisector) when vLLM builds the model, before anything is compiled."""
    try:
        import torch._dynamo

        torch._dynamo.config.disable = True
    except Exception:
        LOG.debug("plancache: torch.compile not switched off", exc_info=True)


def switch_off_torch_caches() -> None:
    """torch's FX graph, AOTAutograd and autotune caches off: nothing is read from disk for them."""
    try:
        from torch._inductor import config

        config.fx_graph_cache = False
        config.autotune_local_cache = False
        config.bundled_autotune_remote_cache = False
        from torch._functorch import config as functorch_config

        functorch_config.enable_autograd_cache = False
    except Exception:
        LOG.debug("plancache: torch's caches not switched off", exc_info=True)


def private_dir(name: str) -> Path:
    """A path for a fresh directory inside the boot directory (not created)."""
    return boot_dir() / name


def _mine() -> Path | None:
    """This process's boot directory, or with none to be had its cold scratch (None: neither)."""
    try:
        return boot_dir()
    except StoreError:
        return scratch_dir()


def is_private(path: str | None) -> bool:
    """Inside this process's boot directory (or, with none to be had, its cold scratch)."""
    mine = _mine()
    return (
        path is not None
        and mine is not None
        and os.path.abspath(path).startswith(str(mine) + os.sep)
    )


def in_a_copy(path: str | None) -> bool:
    """Inside the boot directory, and not its default ``inductor/`` (a guarded cache's copy)."""
    mine = _mine()
    return (
        is_private(path)
        and mine is not None
        and not os.path.abspath(path or "").startswith(str(mine / "inductor"))
    )


def redirect(signed_inductor: Path, private_inductor: Path) -> None:
    """From now on, wherever vLLM points inductor at ``signed_inductor``, use
    ``private_inductor``."""
    plugin_state.current().place.redirects[os.path.abspath(signed_inductor)] = private_inductor
    point_inductor(private_inductor)


def point_inductor(directory: Path) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.environ[INDUCTOR_ENV] = str(directory)


def ensure_private() -> str | None:
    """Before torch compiles or runs compiled code: ``TORCHINDUCTOR_CACHE_DIR`` inside the boot
    directory. Returns the outside path it found (None if it was private already)."""
    current = os.environ.get(INDUCTOR_ENV)
    if is_private(current):
        return None
    redirects = plugin_state.current().place.redirects
    target = redirects.get(os.path.abspath(current)) if current else None
    mine = _mine()
    if target is None and mine is not None:
        target = mine / "inductor"
    if target is not None:
        point_inductor(target)
    return current


def _pin(mine: Path, private_root: Path | None) -> None:
    """Every torch cache in ``mine`` (a boot directory, or with ``private_root`` None the cold
    scratch): inductor, Triton, ``default_cache_dir`` and the precompiled headers (the node's
    in ``private_root/headers`` when it is usable, else ``mine/default``'s)."""
    point_inductor(mine / "inductor")
    (mine / "triton").mkdir(mode=0o700, exist_ok=True)
    os.environ[TRITON_ENV] = str(mine / "triton")
    default = mine / "default"
    default.mkdir(mode=0o700, exist_ok=True)
    _pin_bindings()
    try:
        from torch._inductor import codecache

        shared = node_headers(private_root) if private_root is not None else None
        headers = shared or default / "precompiled_headers"
        _pin_headers(headers)
        if private_root is None:
            return
        from . import boot_headers as pch

        if shared is not None:
            pch.place(private_root.parent, shared)
        codecache._precompile_header = pch.wrap(  # type: ignore[assignment]  # torch types it as functools.cache's wrapper, which ours is (or torch's own, left as it is)
            codecache._precompile_header
        )
    except Exception:
        LOG.debug("plancache: torch's precompiled headers not pinned", exc_info=True)


def _pin_headers(headers: Path) -> None:
    """torch's precompiled-header directory (fixed when ``codecache`` was imported, from the
    squattable ``default_cache_dir``) re-pointed at ``headers``."""
    from torch._inductor import codecache

    codecache._HEADER_DIR = str(headers)
    codecache._HEADER_LOCK_DIR = str(headers / "locks")


def _pin_bindings() -> None:
    """Every binding of torch's ``cache_dir`` and ``default_cache_dir`` (where defined, and in
    each torch module that imported them by name) answered from this process's own directory,
    whether or not vLLM's entries were wrapped: torch reuses any kernel module at its
    content-hash name under ``cache_dir()``, whatever the environment says."""
    try:
        from torch._inductor.runtime import cache_dir_utils

        for attr, make in (
            ("cache_dir", _private_cache_dir),
            ("default_cache_dir", _private_default),
        ):
            defined = getattr(cache_dir_utils, attr)
            original = getattr(defined, "__wrapped__", defined)
            for name, module in list(sys.modules.items()):
                # not another package's: a lazy attribute there may import (and fail)
                if not name.startswith("torch"):
                    continue
                bound = getattr(module, attr, None)
                ours = (
                    isinstance(bound, types.FunctionType)
                    and getattr(bound, "__wrapped__", None) is original
                )
                if bound is original or ours:
                    setattr(module, attr, make(original))
    except Exception:
        LOG.debug("plancache: torch's cache directories not pinned", exc_info=True)


NOWHERE = os.path.join(os.devnull, "plancache-no-private-dir")
"""torch's cache directory when this process has none: a path below ``/dev/null``, which no
one (root included) can create or read (``ENOTDIR``). Every lookup torch makes finds nothing
there and every write fails, without a squattable default and without an exception where torch
merely asks (``torch.compile`` reads its bisector's state from it)."""


def _private_cache_dir(original: Callable[[], str]) -> Callable[[], str]:
    """torch's ``cache_dir``, never outside the calling process's own directory: a path outside
    is re-pointed (:func:`ensure_private`) before torch reads it; with none, :data:`NOWHERE`."""

    def cache_dir() -> str:
        if not is_private(os.environ.get(INDUCTOR_ENV)):
            ensure_private()
            if not is_private(os.environ.get(INDUCTOR_ENV)):
                return NOWHERE
        return original()

    cache_dir.__wrapped__ = original  # type: ignore[attr-defined]  # where torch's own is, for a second pin
    return cache_dir


def _private_default(original: Callable[[], str]) -> Callable[[], str]:
    """torch's ``default_cache_dir``, answered from the calling process's own boot directory
    (a forked worker's, not its parent's); with none at all, :data:`NOWHERE` (never the
    squattable ``$TMPDIR/torchinductor_<user>``)."""

    def default_cache_dir() -> str:
        mine = _mine()
        if mine is None:
            return NOWHERE
        return str(mine / "default")

    default_cache_dir.__wrapped__ = original  # type: ignore[attr-defined]  # where torch's own is, for a second pin
    return default_cache_dir


def node_headers(private_root: Path) -> Path | None:
    """``<private root>/headers``: the precompiled header, kept across boots on this node.
    Inductor builds it before it loads even a warm cache (149 MiB, 11-60 s of gcc), so a fresh
    one per boot would cost every warm boot that, and shipping it inside the signed cache cost
    every pull 149 MiB. It is built locally from torch's own headers, or installed verified
    from the store's signed companion of a pulled cache (:mod:`.headers`), in a directory only
    this user can write (reached without following links, checked to be ours and mode 0700);
    anything else there (a link, another owner, group or world access) and the boot's own
    fresh directory is used instead. Never a shared default."""
    from ...storage.compile_cache.header_files import private_dir

    return private_dir(private_root)


def compiles_nothing() -> bool:
    """Whether this process has nowhere to compile into (no private directory, no scratch):
    then torch compiles nothing (:func:`compile_nothing`)."""
    return _mine() is None


def guarded_call(
    original: Callable[..., Any],
    on_outside: Callable[[str], None],
    eager: Callable[..., Any],
) -> Callable[..., Any]:
    """Wrap a vLLM entry into torch (compile, or a compiled call) with :func:`ensure_private`;
    ``on_outside`` hears of each outside path found (once it was re-pointed). With nowhere to
    compile into (:func:`compiles_nothing`), ``eager`` answers instead: vLLM's AOT entry
    compiles whatever ``torch._dynamo.config.disable`` says."""
    import functools

    @functools.wraps(original)
    def call(*args: object, **kwargs: object) -> Any:
        if compiles_nothing():
            return eager(*args, **kwargs)
        outside = ensure_private()
        if outside is not None:
            on_outside(outside)
        return original(*args, **kwargs)

    plugin_state.mark(call)
    return call
