"""A precompiled header gcc left unfinished is rebuilt by torch, not used for good (issue 46,
item 5), on torch's real CPU compile path: inductor's own ``_precompile_header`` under the
plugin's wrapper, g++ building ``cpp_prefix.h``'s header into the node's private headers
directory, then a kernel compiled against it.

gcc writes ``gpcWrite`` where its ident goes first and the ident last, so a build killed midway
leaves a file that begins so (tests/test_compile_install_atomic.py kills a real g++ to show it);
torch never rebuilds a header whose file exists, and g++ then fails every kernel that includes
it ("cannot read PCH file"). Each torch run is a process of its own (torch's caches live in
the process), under the shared heavy-run lock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
RUN = """
import json, logging, os, sys
logging.basicConfig(level=logging.INFO)
from pathlib import Path
import torch
from torch._inductor import codecache
from plancache.vllm_plugin.compile_cache import boot_headers

base = Path(sys.argv[1])
headers = base / "private" / "headers"
headers.mkdir(parents=True, mode=0o700, exist_ok=True)
codecache._HEADER_DIR = str(headers)
codecache._HEADER_LOCK_DIR = str(headers / "locks")
boot_headers.place(base / "private", headers)
codecache._precompile_header = boot_headers.wrap(codecache._precompile_header)
fn = {"first": lambda x: x.sin() + 1, "second": lambda x: x.cos() * 2}[sys.argv[2]]
x = torch.arange(8.0)
out = torch.compile(fn, backend="inductor")(x)
names = sorted(n for n in os.listdir(headers) if n.endswith(".gch"))
print("RESULT " + json.dumps({"ok": bool(torch.allclose(out, fn(x))), "headers": names}))
"""


def _torch_run(base: Path, which: str) -> dict[str, object]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "VLLM_"))},
        "PYTHONPATH": f"{TESTS.parent / 'src'}{os.pathsep}{TESTS}",
        "TORCHINDUCTOR_CACHE_DIR": str(base / "inductor"),
    }
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(base), which],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result: dict[str, object] = json.loads(lines[0][len("RESULT ") :])
    result["stderr"] = done.stderr
    return result


def test_torch_rebuilds_a_header_gcc_left_unfinished(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "private").mkdir(mode=0o700)
    first = _torch_run(tmp_path, "first")
    assert first["ok"] and first["headers"], first
    headers = tmp_path / "private" / "headers"
    gch = headers / str(first["headers"][0])  # type: ignore[index]  # the child answers JSON: a list here
    whole = gch.read_bytes()
    assert whole[:4] == b"gpch", whole[:8]
    gch.write_bytes(b"gpcWrite" + whole[8 : len(whole) // 3])  # what a killed g++ leaves
    second = _torch_run(tmp_path, "second")  # the old code: g++ "cannot read PCH file"
    assert second["ok"], second
    assert "removed: gcc left it unfinished" in str(second["stderr"]), second["stderr"]
    rebuilt = gch.read_bytes()  # whole again (g++ output differs by a few bytes a build)
    assert rebuilt[:4] == b"gpch" and len(rebuilt) > len(whole) // 2
