"""One vLLM boot of the compile-cache recipe's toy module, in its own process (torch keeps
in-process caches, so every boot of a test is a fresh interpreter).

Run as ``python tests/compile_toy.py [OUT.json]`` with ``VLLM_CACHE_ROOT`` (and, for the guard,
``PLANCACHE_COMPILE_CACHE=1`` + ``PLANCACHE_TRUSTED_KEYS``) in the environment. It loads the
general plugins as a worker does, builds the ``@support_torch_compile`` toy module through
``VllmBackend`` (``VLLM_COMPILE`` mode, inductor) and runs the first forward, which loads the
cache or compiles and saves it. It prints (and writes) vLLM's compilation counters, the time of
the first forward and where the inductor/triton caches pointed.
"""

import json
import logging
import os
import sys
import time


def _local_writer_at_read() -> None:
    """``COMPILE_TOY_REWRITE=<outside file>|<payload file>``: a local writer who rewrites, in
    place, a file hard-linked into the cache, at the exact moment vLLM reads it: right after
    vLLM opened ``rank_*/model`` (after the guard returned) and before torch unpickles it. The
    timing is deterministic, not a race: the write happens inside the loader's first call."""
    spec = os.environ.get("COMPILE_TOY_REWRITE")
    if not spec:
        return
    import torch

    outside, payload = spec.split("|")
    original = torch.compiler.load_compiled_function

    def load(f, *args, **kwargs):
        with open(payload, "rb") as src, open(outside, "r+b") as dst:  # the shared inode, in place
            data = src.read()
            dst.write(data)
            dst.truncate(len(data))
        with open(outside + ".fired", "w") as done:
            done.write(getattr(f, "name", "?"))
        return original(f, *args, **kwargs)

    torch.compiler.load_compiled_function = load


def _record_kernel_loads() -> list[str]:
    """Every kernel module torch imports during the boot, by path (``PyCodeCache.
    load_by_key_path``, which reads whatever file lies at the content-hash name), and where
    torch's own caches point at that moment: what the test asserts about *compile time*."""
    from torch._inductor import codecache

    loaded: list[str] = []
    original = codecache.PyCodeCache.load_by_key_path.__func__

    def load_by_key_path(cls, key, path, *args, **kwargs):
        loaded.append(path)
        return original(cls, key, path, *args, **kwargs)

    codecache.PyCodeCache.load_by_key_path = classmethod(load_by_key_path)
    return loaded


def _unsupported_vllm() -> None:
    """``COMPILE_TOY_UNSUPPORTED=1``: the guard finds one of vLLM's objects missing, as on a vLLM
    it does not support (its install then fails the way it does there)."""
    if not os.environ.get("COMPILE_TOY_UNSUPPORTED"):
        return
    import types

    from plancache.vllm_plugin.compile_cache import guard

    missing = types.ModuleType("vllm.compilation.decorators")
    guard._targets = lambda: ((missing, "_try_load_aot_compiled_fn", None),)


def _chain(path):
    """(path, uid, mode) of ``path`` and each directory above it, while this process lives."""
    if not path:
        return []
    found = []
    for step in [path, *[str(p) for p in __import__("pathlib").Path(path).parents]]:
        try:
            st = os.lstat(step)
        except OSError:
            continue
        found.append((step, st.st_uid, st.st_mode & 0o7777))
    return found


def main() -> None:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    logging.getLogger("vllm.plancache").setLevel(logging.INFO)  # the plugin's decision lines
    import torch
    from vllm.plugins import load_general_plugins

    _unsupported_vllm()
    load_general_plugins()
    if os.environ.get("COMPILE_TOY_CACHES_OFF"):  # torch's configuration as a worker without a
        from plancache.vllm_plugin.compile_cache.torch_caches import switch_off_torch_caches

        switch_off_torch_caches()  # private place sets it (vLLM hashes it into the AOT path)
    _local_writer_at_read()
    loaded = _record_kernel_loads()
    if not hasattr(torch.ops._C, "rotary_embedding"):
        lib = torch.library.Library("_C", "FRAGMENT")
        lib.define("rotary_embedding(Tensor x) -> Tensor")
        lib.impl("rotary_embedding", lambda x: x.clone(), "CompositeExplicitAutograd")
    from vllm.compilation.counter import compilation_counter
    from vllm.compilation.decorators import support_torch_compile
    from vllm.config import CompilationConfig, DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.config.compilation import CompilationMode, CUDAGraphMode
    from vllm.forward_context import set_forward_context

    @support_torch_compile
    class Tiny(torch.nn.Module):
        def __init__(self, *, vllm_config=None, prefix=""):
            super().__init__()
            self.l = torch.nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.gelu(self.l(x)) * 2 + x.sin()

    vc = VllmConfig(
        compilation_config=CompilationConfig(
            mode=CompilationMode.VLLM_COMPILE,
            backend="inductor",
            cudagraph_mode=CUDAGraphMode.NONE,
            compile_sizes=[],
        ),
        device_config=DeviceConfig(device="cpu"),
    )
    vc.compilation_config.mode = CompilationMode.VLLM_COMPILE
    vc.compilation_config.compile_sizes = vc.compilation_config.compile_sizes or []
    torch.manual_seed(0)
    with set_current_vllm_config(vc):
        m = Tiny(vllm_config=vc)
    x = torch.randn(8, 16)
    started = time.monotonic()
    error = None
    try:
        with set_current_vllm_config(vc), set_forward_context(None, vc), torch.no_grad():
            out = m(x)
        expected = torch.nn.functional.gelu(m.l(x)) * 2 + x.sin()
        correct = bool(torch.allclose(out, expected, atol=1e-4))
    except Exception as exc:
        error, correct = f"{type(exc).__name__}: {exc}", False
    report = {
        "first_forward_s": time.monotonic() - started,
        "counters": {k: v for k, v in vars(compilation_counter).items() if isinstance(v, int)},
        "correct": correct,
        "error": error,
        "inductor_cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR"),
    }
    from torch._inductor import codecache

    report["header_dir"] = codecache._HEADER_DIR
    report["kernels_loaded"] = list(loaded)
    report["chains"] = {
        name: _chain(report[name])
        for name in ("inductor_cache_dir", "triton_cache_dir", "header_dir")
    }
    report["kernel_chains"] = [_chain(os.path.dirname(path)) for path in loaded[:5]]
    text = json.dumps(report)
    print("COMPILE_TOY " + text, flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text)
    if error and os.environ.get("COMPILE_TOY_RAISE"):
        sys.exit(3)


if __name__ == "__main__":
    main()
