"""Test-only vLLM general plugin of the engine tests: what each engine process saw, at its exit.

Found through ``plancache_engine_probe-0.0.dist-info`` beside it when tests/engine_site is on
the engine processes' ``PYTHONPATH`` (nothing is installed). vLLM loads general plugins in all
three processes of a boot (the caller or API server, ``EngineCore``, the worker); only the
worker's ``vllm.compilation.counter`` counts, and only the worker runs the model, so each
process writes what it saw to ``$PLANCACHE_ENGINE_PROBE_DIR/probe-<pid>.json`` from an atexit
hook (vLLM's CPU platform uses ``spawn``, whose children leave through ``sys.exit``, so the
hooks run after ``LLM()``) and every half second from a daemon thread (the server's shutdown
kills its engine processes, so a server's test waits a second after its last request and reads
the last write): compilation counters, the ``plancache`` modules imported, whether vLLM's compile
cache read and startup-plan functions are vLLM's own or wrapped.

**Workaround for a vLLM bug, not plancache code** (``PLANCACHE_ENGINE_FINALIZE_SHIM=1``): vLLM
0.32 on CPU cannot load its own AOT artifact. ``_try_load_aot_compiled_fn`` calls
``loaded_fn._artifacts.compiled_fn.finalize_loading(vllm_config)`` unconditionally, but on the
CPU path (``DYNAMO_TRACE_ONCE`` with backend ``inductor``, no ``VllmBackend``) ``compiled_fn`` is
torch's own callable, which has no ``finalize_loading``: the load raises ``AttributeError``,
vLLM warns "Compiling model again due to a load failure" and recompiles (fast: inductor's cache
hits). The shim wraps ``torch.compiler.load_compiled_function`` to give such a callable a no-op
``finalize_loading`` (there is nothing to finalise: torch already loaded it), so the tests can
show a verified cache *loaded* (``num_aot_artifacts_loaded=1``), as it is on GPU.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import threading
import time
from typing import Any

PROBE_DIR_ENV = "PLANCACHE_ENGINE_PROBE_DIR"
SHIM_ENV = "PLANCACHE_ENGINE_FINALIZE_SHIM"
_registered = False


def _patched(module_name: str, attribute: str) -> bool | None:
    """Whether ``module.attribute`` is wrapped by plancache; None if the module is not imported."""
    module = sys.modules.get(module_name)
    if module is None:
        return None
    target: Any = module
    for part in attribute.split("."):
        target = getattr(target, part, None)
    return bool(getattr(target, "__plancache__", False))


def _report() -> None:
    directory = os.environ.get(PROBE_DIR_ENV)
    if not directory:
        return
    counter_module = sys.modules.get("vllm.compilation.counter")
    counters = {}
    if counter_module is not None:
        counters = {
            k: v for k, v in vars(counter_module.compilation_counter).items() if isinstance(v, int)
        }
    codecache = sys.modules.get("torch._inductor.codecache")
    report = {
        "pid": os.getpid(),
        "argv": sys.argv[:3],
        "counters": counters,
        "plancache_modules": sorted(
            m for m in sys.modules if m == "plancache" or m.startswith("plancache.")
        ),
        "patched": {
            "aot_load": _patched("vllm.compilation.decorators", "_try_load_aot_compiled_fn"),
            "initialize_cache": _patched(
                "vllm.compilation.backends", "CompilerManager.initialize_cache"
            ),
            "apply_plan": _patched("vllm.v1.worker.startup_plan", "maybe_apply_startup_plan"),
            "save_plan": _patched("vllm.v1.worker.startup_plan", "maybe_save_startup_plan"),
        },
        "inductor_cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        "header_dir": getattr(codecache, "_HEADER_DIR", None) if codecache is not None else None,
        "shim_used": _shim_calls,
    }
    path = os.path.join(directory, f"probe-{os.getpid()}.json")
    tmp = f"{path}.{threading.get_ident()}.tmp"  # the atexit hook and the thread may both write
    with open(tmp, "w") as f:
        json.dump(report, f)
    os.replace(tmp, path)


_shim_calls = 0


def _every_half_second() -> None:
    while True:
        time.sleep(0.5)
        try:
            _report()
        except Exception:
            pass


def _install_finalize_shim() -> None:
    """See the module docstring: a workaround for vLLM 0.32's CPU AOT load, labelled as such."""
    import torch

    original = torch.compiler.load_compiled_function
    if getattr(original, "__engine_probe__", False):
        return

    @functools.wraps(original)
    def load_compiled_function(*args: Any, **kwargs: Any) -> Any:
        global _shim_calls  # noqa: PLW0603 - one count per engine process, read by _report
        loaded = original(*args, **kwargs)
        compiled = getattr(getattr(loaded, "_artifacts", None), "compiled_fn", None)
        if compiled is not None and not hasattr(compiled, "finalize_loading"):
            compiled.finalize_loading = lambda vllm_config: None
            _shim_calls += 1
        return loaded

    load_compiled_function.__engine_probe__ = True  # type: ignore[attr-defined]  # the probe's mark
    torch.compiler.load_compiled_function = load_compiled_function


def register() -> None:
    """The ``vllm.general_plugins`` entry point (called several times per process)."""
    global _registered  # noqa: PLW0603 - vLLM calls the entry point more than once a process
    if _registered:
        return
    _registered = True
    atexit.register(_report)
    threading.Thread(target=_every_half_second, name="engine-probe", daemon=True).start()
    if os.environ.get(SHIM_ENV) == "1":
        _install_finalize_shim()
