"""Tampering of a real compile cache, one function per class, for test_compile_cache_vllm.py.

Each function gets the cache directory of a hard-linked copy and a marker path, and changes
the copy the way an attacker with write access to the bucket, a peer or the directory would:
with a real payload (:mod:`compile_payloads`) where torch would read the bytes, so the
unguarded control boots can show the payload runs.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import compile_payloads as P
from plancache.trust.compile_cache.manifest import MAX_FILE_BYTES

PY = sys.executable
SRC = str(Path(__file__).resolve().parents[1] / "src")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "plancache.cli.main", *args],
        env=dict(os.environ, PYTHONPATH=SRC),
        capture_output=True,
        text=True,
        timeout=300,
    )


def t_rank_pickle(d: Path, marker: Path) -> None:
    P.replace(d / "rank_0_0" / "model", P.pickle_payload(marker))


def t_generated_py(d: Path, marker: Path) -> None:
    for f in glob.glob(str(d / "inductor_cache" / "*" / "*.py")):
        P.append(Path(f), P.py_line(marker))


def t_shared_object(d: Path, marker: Path) -> None:
    so = P.shared_object(marker, marker.parent)
    for f in glob.glob(str(d / "inductor_cache" / "*" / "*.so")):
        P.replace(Path(f), so)


def t_extra_aotautograd(d: Path, marker: Path) -> None:
    """An added pickle beside the real aotautograd entry, and the rank file gone so vLLM
    recompiles."""
    (d / "rank_0_0" / "model").unlink()
    entry = Path(glob.glob(str(d / "inductor_cache" / "aotautograd" / "*"))[0])
    (entry / "zz-payload").write_bytes(P.pickle_payload(marker))


def t_symlink(d: Path, marker: Path) -> None:
    outside = marker.parent / "outside-model"
    outside.write_bytes(P.pickle_payload(marker))
    (d / "rank_0_0" / "model").unlink()
    (d / "rank_0_0" / "model").symlink_to(outside)


def t_unsigned(d: Path, marker: Path) -> None:
    t_rank_pickle(d, marker)
    (d.parent / (d.name + ".plancache.sig")).unlink()


def _resign_as(d: Path, other: str) -> None:
    """Sign the directory as it is under another name (a trusted signer, another configuration)."""
    moved = d.with_name(other)
    os.rename(d, moved)
    root = d.parents[2]
    assert cli(
        "compile-cache", "sign", "--key", str(root.parents[1] / "keys" / "key"), str(root)
    ).returncode in (0, 1)
    os.rename(moved, d)
    os.replace(moved.with_name(other + ".plancache.sig"), d.with_name(d.name + ".plancache.sig"))


def t_renamed(d: Path, marker: Path) -> None:
    P.replace(d / "rank_0_0" / "model", P.pickle_payload(marker))
    _resign_as(d, "f" * 64)


def t_swapped_ranks(d: Path, marker: Path) -> None:
    """rank_1_0/model is a (signed) payload; then the two rank files trade places."""
    (d / "rank_1_0").mkdir()
    (d / "rank_1_0" / "model").write_bytes(P.pickle_payload(marker))
    _resign_as(d, d.name)
    a, b = d / "rank_0_0" / "model", d / "rank_1_0" / "model"
    tmp = d / "rank_0_0" / "swap"
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)


def t_triton_dir(d: Path, marker: Path) -> None:
    """An extra ``triton/`` kernel directory where the guard pins ``TRITON_CACHE_DIR``."""
    kernel = d / "inductor_cache" / "triton" / "0" / "payload"
    kernel.mkdir(parents=True)
    (kernel / "payload.py").write_bytes(P.py_line(marker))


def t_fifo(d: Path, marker: Path) -> None:
    """``rank_0_0/model`` is a FIFO: unguarded, vLLM's ``open`` would block the worker forever."""
    (d / "rank_0_0" / "model").unlink()
    os.mkfifo(d / "rank_0_0" / "model")


def t_oversize(d: Path, marker: Path) -> None:
    """An unlisted file one byte over the per-file cap (sparse: no disk used, 4 GiB to hash)."""
    (d / "inductor_cache" / "zz").mkdir()
    with open(d / "inductor_cache" / "zz" / "czz.so", "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)


def t0_generated_py(d: Path, marker: Path) -> None:
    """``VLLM_USE_AOT_COMPILE=0``: a line appended to the generated module in the rank's inductor
    cache."""
    for f in glob.glob(str(d / "rank_0_0" / "inductor_cache" / "*" / "*.py")):
        P.append(Path(f), P.py_line(marker))


GUARDED: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "rank-pickle": (t_rank_pickle, "digest-mismatch"),
    "generated-py": (t_generated_py, "digest-mismatch"),
    "shared-object": (t_shared_object, "digest-mismatch"),
    "extra-aotautograd": (t_extra_aotautograd, "digest-mismatch"),
    "symlink": (t_symlink, "malformed"),
    "unsigned": (t_unsigned, "unsigned"),
    "renamed": (t_renamed, "name-mismatch"),
    "swapped-ranks": (t_swapped_ranks, "digest-mismatch"),
    "triton-dir": (t_triton_dir, "digest-mismatch"),
    "fifo": (t_fifo, "malformed"),
    "oversize": (t_oversize, "too-large"),
}
CONTROLS = ("rank-pickle", "generated-py", "shared-object", "extra-aotautograd")
"""The payload classes also booted without the guard: the marker must appear there."""
