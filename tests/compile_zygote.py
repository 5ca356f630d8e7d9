"""A fork server for tests/compile_toy.py (and tests/vllm_rank.py): vLLM 0.33's modules imported
once, every boot a fork.

Why: importing torch and vLLM's compile modules costs 12-15 s of CPU per interpreter on this
machine, against 2 s for a warm load and ~20 s for a compile; the compile-cache fixture boots
~35 times, so half its time was imports. The zygote (``python tests/compile_zygote.py``) imports
what compile_toy imports, except the plugins, and runs nothing: no compile, no plugin, no
plancache module (checked at start). Each boot is then ``fork()`` + compile_toy's ``main`` in the
child, with the boot's environment, working directory and output files, so every boot still
starts from an interpreter in which nothing was compiled or guarded; the child exits as an
interpreter does (``atexit``, non-daemon threads joined), so the plugin's exit work runs.

What torch binds at import from ``$TMPDIR`` (:data:`IMPORT_BOUND`) is bound again in the child
from the boot's own ``$TMPDIR``, as a fresh interpreter would bind it; the zygote's own HOME and
TMPDIR are a directory the tests check stays empty (nothing a boot wrote went to the
zygote's paths). ``COMPILE_TOY_FRESH=1`` boots fresh interpreters instead (compile_boots).

The rank processes of tests/test_vllm_ranks.py fork from a zygote of their own the same way
(``Zygote(..., preload=vllm_rank.PRELOAD)`` and :meth:`Zygote.start` with ``script``): it imports
vLLM's config, distributed and worker modules, never initialises torch.distributed and never
imports plancache, so every rank still joins its gloo world and loads the plugin itself. And the
engine tests' ``LLM()`` processes (tests/engine_harness.py) fork from one run by the engine venv's
interpreter (``python=``), which imported what tests/engine_boot.py's ``LLM()`` imports
(``engine_boot.PRELOAD``): vLLM then spawns the engine core and its worker as fresh interpreters,
as always on CPU, so only the front process of a boot is a fork.

Protocol: one JSON request a line on stdin (``script``, ``argv``, ``env``, ``cwd``, ``stdout``,
``stderr``, ``done``); the zygote writes ``<done>.pid`` at the fork and ``<done>`` (the exit code)
when it reaps the child. One zygote serves any number of concurrent boots. ``python
compile_zygote.py [MODULE ...]`` imports the modules given, :data:`PRELOAD` without any.
"""

from __future__ import annotations

import gc
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TOY = str(Path(__file__).parent / "compile_toy.py")


def _rebind_import_time_paths() -> None:
    """In the child: what torch computed from ``$TMPDIR`` when the zygote imported it (a module
    the zygote did not import binds its paths in the child, from the child's environment)."""
    import tempfile

    tempfile.tempdir = None  # gettempdir() caches its first answer
    if "torch._inductor.codecache" in sys.modules:
        from torch._inductor import codecache
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        codecache._HEADER_DIR = os.path.join(default_cache_dir(), "precompiled_headers")
        codecache._HEADER_LOCK_DIR = os.path.join(codecache._HEADER_DIR, "locks")
    if "torch._dynamo.package" not in sys.modules:
        return
    try:  # off by default (SECURITY.md), bound at import all the same
        from torch._dynamo import package
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        package.DynamoCache = package.DiskDynamoCache(os.path.join(cache_dir(), "dynamo"))
        context = sys.modules.get("torch._dynamo.precompile_context")
        if context is not None and hasattr(context, "DynamoCache"):
            context.DynamoCache = package.DynamoCache
    except (ImportError, AttributeError, TypeError):
        pass


IMPORT_BOUND = (
    "tempfile.tempdir",
    "torch._inductor.codecache._HEADER_DIR",
    "torch._dynamo.package.DynamoCache",
)


def _child(request: dict[str, Any]) -> None:
    """Become the boot: fds, environment, cwd, argv; then compile_toy's ``__main__``. Never returns
    normally: raises SystemExit so that the interpreter exits as a fresh one would."""
    import runpy

    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        if fd == 2 and path == request["stdout"]:  # one log for both, as stderr=subprocess.STDOUT
            os.dup2(1, 2)
            continue
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    _rebind_import_time_paths()
    script = request.get("script", TOY)
    sys.argv = [script, *request.get("argv", [])]
    code: int | str | None = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    raise SystemExit(code)


PRELOAD = (
    # what compile_toy imports before it loads the plugins
    "torch",
    "vllm.plugins",
    "vllm.compilation.counter",
    "vllm.compilation.decorators",
    "vllm.config",
    "vllm.config.compilation",
    "vllm.forward_context",
    # what a boot imports later (the plugin's wrapped modules, vLLM's compile passes: 13 s of a
    # boot's imports, found with ``python -X importtime tests/compile_toy.py``); a missing one costs
    # time only
    "vllm.compilation.backends",
    "vllm.compilation.wrapper",
    "vllm.compilation.caching",
    "vllm.compilation.passes.pass_manager",
    "vllm.compilation.passes.ir.inplace_functionalization",
    "vllm.compilation.passes.ir.lowering_pass",
    "vllm.lora.request",
    "vllm.lora.resolver",
    "vllm.tracing",
    "vllm.kernels",
    "vllm.v1.executor",
    "torch.distributed.tensor.experimental._func_map",
    "sympy.tensor.tensor",
    "torch.export._trace",
    "torch._inductor.fx_passes.pad_mm",
    "torch._inductor.fx_passes.quantization",
    "torch._inductor.fx_passes.efficient_conv_bn_eval",
    "torch._inductor.codegen.wrapper_fxir",
    "torch._inductor.codegen.memory_planning",
    "torch._inductor.codegen.pallas",
)
"""Modules the zygote imports: vLLM's and torch's own, never plancache's (the plugin is loaded by
each boot, as vLLM loads it)."""


def _serve(preload: tuple[str, ...]) -> None:
    import importlib

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            print(f"zygote: not preloaded: {name}: {exc}", file=sys.stderr, flush=True)
    assert not [m for m in sys.modules if m.startswith("plancache")], (
        "the zygote must not load the plugin"
    )
    assert threading.active_count() == 1, threading.enumerate()
    # What the preload made lives as long as every child: out of the collector's reach, each
    # child's full collections scan only what the child made (a warm compile boot 2.9 -> 1.6 s of
    # CPU, a cold one 16 -> 14 s), and they no longer write to the pages the child shares with
    # the zygote (the fork-server use that gc.freeze's documentation gives).
    gc.collect()
    gc.freeze()
    children: dict[int, str] = {}
    print("ZYGOTE ready", flush=True)
    open_input, pending = True, b""
    while open_input or children:
        ready, _, _ = select.select([0] if open_input else [], [], [], 0.05)
        if ready:
            # os.read, not sys.stdin.readline: requests sent together arrive in one read, and a
            # line left in sys.stdin's buffer is invisible to select (that boot would wait for
            # the next request to arrive)
            chunk = os.read(0, 1 << 16)
            open_input = bool(chunk)
            pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(request)
            children[pid] = request["done"]
            _write(request["done"] + ".pid", str(pid))
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            _write(children.pop(pid), str(os.waitstatus_to_exitcode(status)))
    sys.stdout.flush()
    sys.stderr.flush()
    # the zygote ran nothing: no exit work to do, and torch's orderly shutdown took ~2 s
    os._exit(0)


def _write(path: str, text: str) -> None:
    with open(path + ".part", "w") as f:
        f.write(text)
    os.replace(path + ".part", path)


class Forked:
    """A process forked by the zygote: as much of ``subprocess.Popen`` as the tests use."""

    def __init__(self, zygote: Zygote, request: dict[str, Any]) -> None:
        self._zygote, self._done = zygote, Path(request["done"])
        self.args = [request["script"], *request["argv"]]
        self.stdout_path, self.stderr_path = request["stdout"], request["stderr"]
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        """Written by the zygote right after the fork."""
        path = Path(f"{self._done}.pid")
        while not path.exists():
            self._zygote.check()
            time.sleep(0.01)
        return int(path.read_text())

    def poll(self) -> int | None:
        if self.returncode is None and self._done.exists():
            self.returncode = int(self._done.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._zygote.check()
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                # not reaped yet (no exit code written), so the pid is still this child's
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass


class Zygote:
    """The client: starts the zygote and runs boots through it, from any number of threads.

    ``own_home`` gives the zygote a HOME and TMPDIR of its own (:meth:`leaked` checks a boot wrote
    nothing there); without it the zygote runs in ``env`` as given (the ranks' zygote: the same
    environment as every rank, so what vLLM and torch read at import is what a rank would read)."""

    def __init__(
        self,
        directory: Path,
        env: dict[str, str],
        preload: tuple[str, ...] = PRELOAD,
        own_home: bool = True,
        python: str = sys.executable,
    ) -> None:
        self.directory = directory
        for name in ("home", "tmp", "boots"):
            (directory / name).mkdir(parents=True, exist_ok=True)
        if own_home:
            env = {**env, "HOME": str(directory / "home"), "TMPDIR": str(directory / "tmp")}
        self._log = open(directory / "zygote.log", "w")  # noqa: SIM115 - the server's life; stop()
        self.proc = subprocess.Popen(
            [python, __file__, *preload],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            cwd=directory,
        )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        assert ready.startswith("ZYGOTE ready"), (directory / "zygote.log").read_text()[-3000:]
        self._lock = threading.Lock()
        self._count = 0

    def check(self) -> None:
        """Raises if the zygote has exited (no fork will ever be reaped then)."""
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"the zygote exited: {(self.directory / 'zygote.log').read_text()[-3000:]}"
            )

    def start(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        stdout: str | None = None,
        stderr: str | None = None,
        script: str = TOY,
    ) -> Forked:
        """Fork one process running ``script`` with ``argv``, like ``subprocess.Popen([python,
        script, *argv])``; its output goes to the files given (default: ``boots/<n>.out`` and
        ``.err``)."""
        with self._lock:
            self._count += 1
            stem = self.directory / "boots" / str(self._count)
            request = {
                "script": script,
                "argv": argv,
                "env": env,
                "cwd": cwd,
                "stdout": stdout or f"{stem}.out",
                "stderr": stderr or f"{stem}.err",
                "done": f"{stem}.rc",
            }
            assert self.proc.stdin is not None and self.proc.poll() is None, "the zygote exited"
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        return Forked(self, request)

    def run(
        self, argv: list[str], env: dict[str, str], cwd: str, timeout: float, script: str = TOY
    ) -> subprocess.CompletedProcess[str]:
        """One boot: like ``subprocess.run([python, script, *argv], capture_output=True)``."""
        forked = self.start(argv, env, cwd, script=script)
        try:
            code = forked.wait(timeout)
        except subprocess.TimeoutExpired:
            forked.kill()
            raise
        return subprocess.CompletedProcess(
            [script, *argv],
            code,
            Path(forked.stdout_path).read_text(),
            Path(forked.stderr_path).read_text(),
        )

    def leaked(self) -> list[str]:
        """Files under the zygote's own HOME and TMPDIR (a boot should have written none there)."""
        return sorted(
            str(p.relative_to(self.directory))
            for d in ("home", "tmp")
            for p in (self.directory / d).rglob("*")
            if p.is_file()
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class ZygoteSlot:
    """A helper module's one zygote between :meth:`start` and :meth:`stop` (its boots fork from it);
    ``$<fresh>=1`` leaves it empty, and the boots start fresh interpreters."""

    def __init__(self, fresh: str) -> None:
        self.fresh = fresh
        self.zygote: Zygote | None = None

    def start(self, make: Callable[[], Zygote]) -> Zygote | None:
        if os.environ.get(self.fresh) != "1":
            self.zygote = make()
        return self.zygote

    def stop(self) -> None:
        zygote, self.zygote = self.zygote, None
        if zygote is not None:
            zygote.stop()


if __name__ == "__main__":
    _serve(tuple(sys.argv[1:]) or PRELOAD)
