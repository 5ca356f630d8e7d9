"""A fork server for tests/compile_toy.py: vLLM 0.33's modules imported once, every boot a fork.

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

Protocol: one JSON request a line on stdin (``argv``, ``env``, ``cwd``, ``stdout``, ``stderr``,
``done``); the zygote writes ``<done>.pid`` at the fork and ``<done>`` (the exit code) when it
reaps the child. One zygote serves any number of concurrent boots.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

TOY = str(Path(__file__).parent / "compile_toy.py")


def _rebind_import_time_paths() -> None:
    """In the child: what torch computed from ``$TMPDIR`` when the zygote imported it."""
    import tempfile

    tempfile.tempdir = None  # gettempdir() caches its first answer
    from torch._inductor import codecache
    from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

    codecache._HEADER_DIR = os.path.join(default_cache_dir(), "precompiled_headers")
    codecache._HEADER_LOCK_DIR = os.path.join(codecache._HEADER_DIR, "locks")
    try:  # off by default (SECURITY.md), bound at import all the same
        from torch._dynamo import package

        package.DynamoCache = package.DiskDynamoCache(os.path.join(cache_dir(), "dynamo"))
        context = sys.modules.get("torch._dynamo.precompile_context")
        if context is not None and hasattr(context, "DynamoCache"):
            context.DynamoCache = package.DynamoCache
    except (ImportError, AttributeError, TypeError):
        pass


IMPORT_BOUND = ("tempfile.tempdir", "torch._inductor.codecache._HEADER_DIR", "torch._dynamo.package.DynamoCache")


def _child(request: dict[str, Any]) -> None:
    """Become the boot: fds, environment, cwd, argv; then compile_toy's ``__main__``. Never returns
    normally: raises SystemExit so that the interpreter exits as a fresh one would."""
    import runpy

    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    _rebind_import_time_paths()
    sys.argv = [TOY, *request.get("argv", [])]
    code: int | str | None = 0
    try:
        runpy.run_path(TOY, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - printed as an uncaught exception would be
        import traceback

        traceback.print_exc()
        code = 1
    raise SystemExit(code)


PRELOAD = (
    # what compile_toy imports before it loads the plugins
    "torch", "vllm.plugins", "vllm.compilation.counter", "vllm.compilation.decorators", "vllm.config",
    "vllm.config.compilation", "vllm.forward_context",
    # what a boot imports later (the plugin's wrapped modules, vLLM's compile passes: 13 s of a
    # boot's imports, found with ``python -X importtime tests/compile_toy.py``); a missing one costs
    # time only
    "vllm.compilation.backends", "vllm.compilation.wrapper", "vllm.compilation.caching",
    "vllm.compilation.passes.pass_manager", "vllm.compilation.passes.ir.inplace_functionalization",
    "vllm.compilation.passes.ir.lowering_pass", "vllm.lora.request", "vllm.lora.resolver", "vllm.tracing",
    "vllm.kernels", "vllm.v1.executor", "torch.distributed.tensor.experimental._func_map", "sympy.tensor.tensor",
    "torch.export._trace", "torch._inductor.fx_passes.pad_mm", "torch._inductor.fx_passes.quantization",
    "torch._inductor.fx_passes.efficient_conv_bn_eval", "torch._inductor.codegen.wrapper_fxir",
    "torch._inductor.codegen.memory_planning", "torch._inductor.codegen.pallas",
)
"""Modules the zygote imports: vLLM's and torch's own, never plancache's (the plugin is loaded by
each boot, as vLLM loads it)."""


def _serve() -> None:
    import importlib

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            print(f"zygote: not preloaded: {name}: {exc}", file=sys.stderr, flush=True)
    assert not [m for m in sys.modules if m.startswith("plancache")], "the zygote must not load the plugin"
    assert threading.active_count() == 1, threading.enumerate()
    children: dict[int, str] = {}
    print("ZYGOTE ready", flush=True)
    open_input = True
    while open_input or children:
        ready, _, _ = select.select([sys.stdin] if open_input else [], [], [], 0.05)
        if ready:
            line = sys.stdin.readline()
            if not line:
                open_input = False
            else:
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


def _write(path: str, text: str) -> None:
    with open(path + ".part", "w") as f:
        f.write(text)
    os.replace(path + ".part", path)


class Zygote:
    """The client: starts the zygote and runs boots through it, from any number of threads."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self.directory = directory
        for name in ("home", "tmp", "boots"):
            (directory / name).mkdir(parents=True, exist_ok=True)
        env = {**env, "HOME": str(directory / "home"), "TMPDIR": str(directory / "tmp")}
        self._log = open(directory / "zygote.log", "w")
        self.proc = subprocess.Popen([sys.executable, __file__], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, cwd=directory)
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        assert ready.startswith("ZYGOTE ready"), (directory / "zygote.log").read_text()[-3000:]
        self._lock = threading.Lock()
        self._count = 0

    def run(self, argv: list[str], env: dict[str, str], cwd: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """One boot: like ``subprocess.run([python, compile_toy.py, *argv], capture_output=True)``."""
        with self._lock:
            self._count += 1
            stem = self.directory / "boots" / str(self._count)
            request = {"argv": argv, "env": env, "cwd": cwd, "stdout": f"{stem}.out", "stderr": f"{stem}.err",
                       "done": f"{stem}.rc"}
            assert self.proc.stdin is not None and self.proc.poll() is None, "the zygote exited"
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        done, deadline = Path(request["done"]), time.monotonic() + timeout
        while not done.exists():
            if time.monotonic() > deadline:
                pid = Path(request["done"] + ".pid")
                if pid.exists():
                    os.kill(int(pid.read_text()), 9)
                raise subprocess.TimeoutExpired([TOY, *argv], timeout)
            if self.proc.poll() is not None:
                raise RuntimeError(f"the zygote exited: {(self.directory / 'zygote.log').read_text()[-3000:]}")
            time.sleep(0.05)
        return subprocess.CompletedProcess([TOY, *argv], int(done.read_text()), Path(request["stdout"]).read_text(),
                                           Path(request["stderr"]).read_text())

    def leaked(self) -> list[str]:
        """Files under the zygote's own HOME and TMPDIR (a boot should have written none there)."""
        return sorted(str(p.relative_to(self.directory)) for d in ("home", "tmp")
                      for p in (self.directory / d).rglob("*") if p.is_file())

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


if __name__ == "__main__":
    _serve()
