"""Every on-disk cache torch 2.13 reads during a guarded boot lies in a private per-boot directory.

With the guard on, this process gets ``$VLLM_CACHE_ROOT/plancache-private/boot-<pid>-<random>/``
(mode 0700, :func:`plancache.storage.compile_cache.private_copy.new_boot_dir`), removed at exit. From the
sources of torch 2.13 and vLLM 0.33, the caches read from disk in any compile mode are:

- ``cache_dir()`` = ``$TORCHINDUCTOR_CACHE_DIR`` (else ``$TMPDIR/torchinductor_<user>``):
  ``fxgraph/`` (FX graph cache, pickles), ``aotautograd/`` (AOTAutograd cache, pickles), the
  kernel modules and libraries (``<2 chars>/*.py|.so``, imported and dlopened), ``cache/`` (local
  autotune), ``dynamo/`` (automatic-dynamic PGO profiles), ``gcc/``, ``autoheuristic/``;
- ``default_cache_dir()`` = ``$TMPDIR/torchinductor_<user>`` whatever the variable says:
  ``precompiled_headers/`` (``codecache._HEADER_DIR``, fixed when torch is imported; kept in
  the node's private ``plancache-private/headers``, see :func:`node_headers`), the on-disk
  caches of ``torch._inductor.cache`` and ``runtime/caching``, Halide's runtime;
- ``$TRITON_CACHE_DIR`` (else ``~/.triton/cache``): Triton kernels;
- vLLM's own directories, which the guard hands over as private copies.

So at install ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` point into the boot directory,
every ``default_cache_dir`` binding torch holds is replaced by one returning ``<boot>/default``
(the precompiled header included), and :func:`ensure_private` runs before every compile or
compiled call vLLM makes: vLLM's AOT path sets ``TORCHINDUCTOR_CACHE_DIR`` to the *signed*
``<hash>/inductor_cache`` right before it compiles, which is re-pointed at the private copy (or,
when nothing was guarded, at a fresh private directory). What stays outside is named in
SECURITY.md (``torch._dynamo``'s precompile cache, off by default, fixed at import).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

LOG = logging.getLogger("vllm.plancache")
INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_ENV = "TRITON_CACHE_DIR"

_boot: Path | None = None
_redirects: dict[str, Path] = {}
"""Signed ``inductor_cache`` paths vLLM may name -> the private copies to use instead."""


def boot_dir() -> Path:
    """This process's private directory (made, and the torch caches pinned, on first use)."""
    global _boot
    if _boot is None:
        from vllm import envs

        from ...storage.compile_cache.private_copy import new_boot_dir

        _boot = new_boot_dir(Path(envs.VLLM_CACHE_ROOT))
        atexit.register(shutil.rmtree, str(_boot), True)
        _pin(_boot)
    return _boot


def private_dir(name: str) -> Path:
    """A path for a fresh directory inside the boot directory (not created)."""
    return boot_dir() / name


def is_private(path: str | None) -> bool:
    return path is not None and os.path.abspath(path).startswith(str(boot_dir()) + os.sep)


def in_a_copy(path: str | None) -> bool:
    """Inside the boot directory, and not its default ``inductor/`` (a guarded cache's copy)."""
    return is_private(path) and not os.path.abspath(path or "").startswith(str(boot_dir() / "inductor"))


def redirect(signed_inductor: Path, private_inductor: Path) -> None:
    """From now on, wherever vLLM points inductor at ``signed_inductor``, use ``private_inductor``."""
    _redirects[os.path.abspath(signed_inductor)] = private_inductor
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
    target = _redirects.get(os.path.abspath(current)) if current else None
    point_inductor(target or boot_dir() / "inductor")
    return current


def _pin(boot: Path) -> None:
    point_inductor(boot / "inductor")
    (boot / "triton").mkdir(mode=0o700, exist_ok=True)
    os.environ[TRITON_ENV] = str(boot / "triton")
    default = boot / "default"
    default.mkdir(mode=0o700, exist_ok=True)
    try:
        from torch._inductor import codecache
        from torch._inductor.runtime import cache_dir_utils

        original = cache_dir_utils.default_cache_dir
        private: Callable[[], str] = lambda: str(default)  # noqa: E731
        for name, module in list(sys.modules.items()):
            if name.startswith("torch") and getattr(module, "default_cache_dir", None) is original:
                module.default_cache_dir = private  # type: ignore[attr-defined]
        from ...storage.compile_cache.private_copy import PRIVATE_SUBDIR

        shared = node_headers(boot.parent) if boot.parent.name == PRIVATE_SUBDIR else None
        headers = shared or default / "precompiled_headers"
        codecache._HEADER_DIR = str(headers)
        codecache._HEADER_LOCK_DIR = str(headers / "locks")
        from . import headers as pch

        if shared is not None:
            pch.place(boot.parent.parent, shared)
        codecache._precompile_header = pch.wrap(codecache._precompile_header)
    except Exception:  # noqa: BLE001 - a torch without them has nothing to pin
        LOG.debug("plancache: torch's default cache directory not pinned", exc_info=True)


def node_headers(private_root: Path) -> Path | None:
    """``plancache-private/headers``: the precompiled header, kept across boots on this node.
    Inductor builds it before it loads even a warm cache (149 MiB, 11-60 s of gcc), so a fresh
    one per boot would cost every warm boot that, and shipping it inside the signed cache cost
    every pull 149 MiB. It is built locally from torch's own headers, or installed verified
    from the store's signed companion of a pulled cache (:mod:`.headers`), in a directory only
    this user can write (reached without following links, checked to be ours and mode 0700);
    anything else there (a link, another owner, group or world access) and the boot's own
    fresh directory is used instead. Never a shared default."""
    from ...storage.compile_cache.headers import private_dir

    return private_dir(private_root)


def guarded_call(original: Callable[..., Any], on_outside: Callable[[str], None]) -> Callable[..., Any]:
    """Wrap a vLLM entry into torch (compile, or a compiled call) with :func:`ensure_private`;
    ``on_outside`` hears of each outside path found (once it was re-pointed)."""
    import functools

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        outside = ensure_private()
        if outside is not None:
            on_outside(outside)
        return original(*args, **kwargs)

    call.__plancache__ = True  # type: ignore[attr-defined]
    return call
