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


def main() -> None:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    logging.getLogger("vllm.plancache").setLevel(logging.INFO)  # the plugin's decision lines
    import torch
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    _local_writer_at_read()
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
    text = json.dumps(report)
    print("COMPILE_TOY " + text, flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text)
    if error and os.environ.get("COMPILE_TOY_RAISE"):
        sys.exit(3)


if __name__ == "__main__":
    main()
