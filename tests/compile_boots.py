"""Booting tests/compile_toy.py (vLLM 0.33's real compile path on CPU) for the compile-cache tests.

Each boot is a fresh process with its own ``VLLM_CACHE_ROOT``, ``HOME`` and ``TMPDIR`` under a
base directory; its report is vLLM's compilation counters, the plugin's decision lines and the
process's stderr. Every boot uses the same root name (``vllm-cache``) under its base.

Between :func:`start_zygote` and :func:`stop_zygote` a boot is a fork of a process that imported
torch and vLLM's modules and ran nothing (tests/compile_zygote.py: the imports were half of each
boot's time); otherwise, or with ``COMPILE_TOY_FRESH=1``, a fresh interpreter.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from compile_tampers import PY, SRC
from compile_zygote import Zygote, ZygoteSlot

TOY = str(Path(__file__).parent / "compile_toy.py")
ROOT_NAME = "vllm-cache"
AOT0 = {"VLLM_USE_AOT_COMPILE": "0"}
DECISION = re.compile(
    r"plancache: compile-cache decision=(\S+) reason=(\S+) cache=\S+ elapsed_ms=(\d+)"
)


_slot = ZygoteSlot("COMPILE_TOY_FRESH")


def start_zygote(directory: Path) -> Zygote | None:
    """Boots fork from one zygote from now on (None under ``COMPILE_TOY_FRESH=1``)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PLANCACHE_", "VLLM_", "TORCHINDUCTOR_", "TRITON_"))
    }
    env.update(PYTHONPATH=SRC, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1")
    return _slot.start(lambda: Zygote(directory, env))


stop_zygote = _slot.stop


def env_for(base: Path, guard: bool, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PLANCACHE_", "VLLM_", "TORCHINDUCTOR_", "TRITON_"))
    }
    env.update(
        PYTHONPATH=SRC,
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        VLLM_CACHE_ROOT=str(base / ROOT_NAME),
        HOME=str(base / "home"),
        TMPDIR=str(base / "tmp"),
    )
    (base / "home").mkdir(exist_ok=True)
    (base / "tmp").mkdir(exist_ok=True)
    if guard:
        env.update(
            PLANCACHE_COMPILE_CACHE="1",
            PLANCACHE_TRUSTED_KEYS=str(base.parent / "keys" / "key.pub"),
        )
    env.update(extra)
    return env


def boot(base: Path, guard: bool = True, **extra: str) -> dict[str, Any]:
    """One vLLM boot in a fresh process; its counters, decision lines and output."""
    env = env_for(base, guard, **extra)
    if _slot.zygote is not None:
        result = _slot.zygote.run([], env, os.getcwd(), timeout=600)
    else:
        result = subprocess.run([PY, TOY], env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("COMPILE_TOY ")]
    assert lines, result.stderr[-3000:]
    report = json.loads(lines[0][len("COMPILE_TOY ") :])
    found = DECISION.findall(result.stderr)
    report["decisions"] = [(action, reason) for action, reason, _ in found]
    report["elapsed_ms"] = [int(ms) for _, _, ms in found]
    report["stderr"] = result.stderr
    return report


def cache_dir(base: Path, aot: bool = True) -> Path:
    """The AOT layout's ``torch_aot_compile/<64 hex>``, or the ``VLLM_USE_AOT_COMPILE=0`` ``<10
    hex>``."""
    pattern = "torch_aot_compile/" + "[0-9a-f]" * 64 if aot else "[0-9a-f]" * 10
    found = glob.glob(str(base / ROOT_NAME / "torch_compile_cache" / pattern))
    return Path(sorted(d for d in found if os.path.isdir(d))[0])


def subject(base: Path, aot: bool = True) -> str:
    return cache_dir(base, aot).relative_to(base / ROOT_NAME / "torch_compile_cache").as_posix()


def quarantined(base: Path) -> list[str]:
    """Quarantine entries anywhere under the root (beside a directory on its own mount too)."""
    return sorted(
        os.path.basename(p)
        for p in glob.glob(
            str(base / ROOT_NAME / "**" / "plancache-quarantine" / "*"), recursive=True
        )
        if not p.endswith(".plancache.sig")
    )
