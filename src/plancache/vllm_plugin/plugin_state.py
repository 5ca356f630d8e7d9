"""What the plugin holds in this process, in one object reached through :func:`current`.

It holds two kinds of things, and a fork treats them differently:

- What the plugin *installed* (:class:`Installed`): vLLM's functions it replaced and their
  originals, the worker and torch methods it wrapped, the ``startup_plan`` module it reads vLLM
  through, where it pinned torch's precompiled headers. These are changes to module objects,
  and a forked child runs with its parent's modules, patches included: the patched functions
  call the originals recorded here and ``uninstall`` undoes them, so the child is handed the
  same record (vLLM does not load plugins again in a forked child: nothing would redo them).
- What this *boot* did: the compile-cache decisions and the private copies handed to vLLM,
  this process's private directory, the header fetch, the boot record, the background pushes,
  the configuration read and the problems said once. A worker that vLLM forks from the process
  that loaded the plugin is a boot of its own and gets all of it fresh: a private directory
  belongs to the pid that made it, a decision to the boot that logged it, and a lock that a
  parent's thread held at the fork would never be released in the child.

So the fork hook (:func:`_forked`, registered with ``os.register_at_fork``) lets go of the
parent's held file locks (:attr:`PluginState.held`) and makes a new object (:func:`start_boot`)
holding the same :class:`Installed` and a fresh everything else, locks included; a test starts
a boot the same way. The object is also renewed when the pid changed under it (a fork
that Python's hooks do not see), so no state ever crosses into another process.

Why one object and not a few globals per module: one event renews all of it, and that is one
line here rather than a reset per module, each with its own fork hook and a test-only twin. What
belongs to one worker *object* (the plan side's configuration, keys and fingerprint,
:mod:`.worker_boot`; the record it writes, :mod:`.record`) stays on that object: a process may
hold several (an in-process executor, the tests).

Imported once a feature is on, never by :func:`plancache.vllm_plugin.register` with both off:
the standard library only (the types it names are imported for type checkers alone).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from importlib.abc import MetaPathFinder
    from pathlib import Path
    from types import ModuleType

    from ..clock import Stopwatch
    from ..pipeline.compile_cache.header_shipping import Cancel, HeadersOutcome
    from ..pipeline.compile_cache.local_caches import CacheOutcome
    from ..storage.compile_cache.boot_dirs import BootDir
    from ..trust.errors import StoreError
    from ..trust.keyring.keys import Signer
    from .compile_cache.guard_settings import Settings
    from .prefetch import Prefetch
    from .record import BootRecord

STARTUP_PLAN = "vllm.v1.worker.startup_plan"
"""vLLM's module whose two functions the hooks replace, and which the plugin reads vLLM through."""
WORKER_MODULES: dict[str, str] = {
    "vllm.v1.worker.gpu_worker": "Worker",
    "vllm_ascend.worker.worker": "NPUWorker",
}
"""Modules that import the startup-plan functions by name -> their worker class (the hooks
patch them; the adapter asks whether a worker runs vLLM's startup-plan path)."""

MARK = "__plancache__"
"""The attribute every wrapper the plugin installs carries (true): how an install knows a
function is its own already (nothing is wrapped twice) and uninstall what is still its."""

Patch = tuple[object, str, object]
"""(object, attribute, original): one replacement made, undone in the reverse order."""

Packed = tuple[bytes, list[tuple[str, int, str]]]
"""Headers compressed for the push (:func:`plancache.pipeline.compile_cache.header_shipping.
pack_headers`)."""


F = TypeVar("F", bound=Callable[..., Any])


def mark(wrapper: F) -> F:
    """``wrapper`` marked as the plugin's (:data:`MARK`)."""
    setattr(wrapper, MARK, True)
    return wrapper


def marked(function: object) -> bool:
    """Whether ``function`` is a wrapper the plugin installed (:data:`MARK`)."""
    return bool(getattr(function, MARK, False))


@dataclass
class Installed:
    """What the plugin changed in this interpreter's modules: carried into a forked child, whose
    modules are its parent's, patches included."""

    startup_plan: ModuleType | None = None
    """vLLM's ``startup_plan`` module the hooks were installed on (None: not installed)."""
    originals: dict[str, Callable[..., Any]] = field(default_factory=dict)
    """vLLM's functions the hooks replaced: ``apply``, ``save``, ``fingerprint``."""
    hook_patches: list[Patch] = field(default_factory=list)
    """Every replacement the startup-plan hooks made, in order (:mod:`.hooks`)."""
    finder: MetaPathFinder | None = None
    """The meta-path hook that patches a worker module as it is imported."""
    guard_patches: list[Patch] = field(default_factory=list)
    """vLLM's compile-cache reads and entries into torch, wrapped by the guard."""
    warm_up_patches: list[Patch] = field(default_factory=list)
    """Worker methods the guard wrapped to end the boot record (no plan side installed)."""
    headers_at: tuple[Path, Path] | None = None
    """(the cache root's parent, the node's private headers directory) once torch's precompiled
    headers are pinned there (torch's ``codecache._HEADER_DIR``, which a fork carries too)."""


@dataclass
class Headers:
    """This boot's precompiled headers (:mod:`.compile_cache.boot_headers`)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    used: list[str] = field(default_factory=list)
    """Headers torch used from the node's headers directory, in order: what a push ships."""
    installed: set[str] = field(default_factory=set)
    """Headers the fetch installed from the store (their source in the header line)."""
    fetch: tuple[Prefetch[HeadersOutcome], Cancel] | None = None
    """The header fetch torch waits for, and its cancel switch (once a boot)."""
    packing: tuple[list[str], Prefetch[Packed]] | None = None
    """The names compressed early on a build node, and that compression."""


@dataclass
class Place:
    """This process's private directory for torch's caches (:mod:`.compile_cache.torch_caches`)."""

    boot: BootDir | None = None
    problem: StoreError | None = None
    """Why no boot directory can be had (every later ask raises it again)."""
    scratch: BootDir | None = None
    no_scratch: bool = False
    """Nothing at all can be written: asked once."""
    redirects: dict[str, Path] = field(default_factory=dict)
    """Signed ``inductor_cache`` paths vLLM may name -> the private copies to use instead."""

    def temp_owner(self) -> str:
        """This boot's private directory's name (``boot-<16 hex>``), "" before it has one: what
        its temporaries are named by (:func:`plancache.storage.local.dirfds.temp_name`), so a
        sweep removes them only once this boot is dead. Asked of the boot's own state, never of
        a module global: a forked worker, whose state is renewed, names its own."""
        return self.boot.path.name if self.boot is not None else ""


@dataclass
class Guard:
    """The compile-cache guard's decisions and settings in this boot (:mod:`.compile_cache`)."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    guarded: dict[str, tuple[Path | None, CacheOutcome | None]] = field(default_factory=dict)
    """Signed directory -> (the private directory vLLM uses instead, the guard's outcome)."""
    decided_at: dict[str, Stopwatch] = field(default_factory=dict)
    """Signed directory -> when the guard decided (a compile's time runs from there)."""
    settings: tuple[Settings | None] | None = None
    """The environment as the guard reads it, once a boot: ``(settings,)`` once read."""
    signer: tuple[Signer | None] | None = None
    """The signing key, once loaded at the first signing: ``(signer,)`` (None: unusable)."""
    pushes_lock: threading.Lock = field(default_factory=threading.Lock)
    pushes: list[threading.Thread] = field(default_factory=list)
    """Background pushes started: the interpreter waits for them at exit."""


@dataclass
class Records:
    """This process's boot record (:mod:`.record`)."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    current: BootRecord | None = None
    """The record being written; a compile-cache decision made before the worker's first hook
    starts it, and the worker's plan side takes it over."""
    last_factors: dict[str, Any] | None = None
    """The cache-key factors vLLM wrote in this process's latest compile."""


@dataclass
class PluginState:
    """The plugin's state in one process: what it installed, and this boot's own."""

    installed: Installed
    pid: int = field(default_factory=os.getpid)
    lock: threading.RLock = field(default_factory=threading.RLock)
    """Held while the plugin patches or unpatches (:attr:`installed`)."""
    switch_reported: bool = False
    """An unknown ``PLANCACHE_COMPILE_CACHE`` was reported (one ERROR line a boot)."""
    install_warned: bool = False
    """vLLM shaped like no supported release was reported (one WARNING a boot)."""
    headers: Headers = field(default_factory=Headers)
    place: Place = field(default_factory=Place)
    guard: Guard = field(default_factory=Guard)
    records: Records = field(default_factory=Records)
    held: set[int] = field(default_factory=set)
    """Descriptors on which this process holds a lock for as long as its boot runs (the
    crash-loop note's ``flock``, :mod:`.plan_health.notes`). A ``flock`` belongs to the open
    file, which a forked child shares: a helper the worker forks (a compile pool started with
    ``fork``) would keep the lock after the worker died, and the next boot would take a dead
    boot's note for a live one's and apply the plan that killed it. So a forked child lets go
    of them at once (:func:`_forked`)."""


_state = PluginState(Installed())


def current() -> PluginState:
    """This process's state (a new boot's if the process changed since it was made)."""
    state = _state
    return state if state.pid == os.getpid() else start_boot()


def start_boot() -> PluginState:
    """A new boot in this process: what the plugin installed is kept, everything else starts
    fresh. Runs in every forked child (registered below), and wherever a test wants a boot of
    its own."""
    global _state  # noqa: PLW0603 - the process's one state object, renewed here only
    _state = PluginState(_state.installed)
    return _state


def _let_go(fds: set[int]) -> None:
    """This process's copies of ``fds`` pointed at ``/dev/null``: the open files they shared
    with the parent (and their locks) are no longer held here, and their numbers stay taken, so
    a later ``close`` of one by code that still holds the number closes nothing else. Never
    ``LOCK_UN``: on a shared open file that would release the parent's lock too."""
    if not fds:
        return
    try:
        null = os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return
    try:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)


def _forked() -> None:
    """In every forked child: the parent's held locks let go of, then a boot of its own."""
    _let_go(_state.held)
    start_boot()


os.register_at_fork(after_in_child=_forked)
