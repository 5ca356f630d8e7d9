"""Payloads planted in a compile cache: each writes a marker file when torch runs it.

Real attempts, not simulations: a pickle whose ``__reduce__`` runs ``exec`` (what ``pickle.load``
of a hostile ``rank_*/model`` or ``fxgraph``/``aotautograd`` entry does), a line appended to a
generated ``.py`` (inductor imports those modules), and a shared object whose constructor runs
at ``dlopen``. The tests assert the marker appears without the guard and never with it.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
from pathlib import Path


def _code(marker: Path, tag: str) -> str:
    return f"open({str(marker)!r}, 'a').write({tag!r} + '\\n')"


class _Payload:
    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self) -> tuple[object, ...]:
        return (exec, (self.code,))


def pickle_payload(marker: Path, tag: str = "pickle") -> bytes:
    return pickle.dumps(_Payload(_code(marker, tag)))


def py_line(marker: Path, tag: str = "py") -> bytes:
    return ("\n" + _code(marker, tag) + "\n").encode()


def shared_object(marker: Path, workdir: Path, tag: str = "so") -> bytes:
    """A .so whose constructor appends ``tag`` to ``marker`` when it is loaded."""
    source = workdir / "payload.c"
    source.write_text(
        "#include <stdio.h>\n__attribute__((constructor)) static void plancache_payload(void) {\n"
        f'  FILE *f = fopen("{marker}", "a"); if (f) {{ fputs("{tag}\\n", f); fclose(f); }}\n}}\n'
    )
    out = workdir / "payload.so"
    subprocess.run(
        [shutil.which("gcc") or "cc", "-shared", "-fPIC", "-o", str(out), str(source)], check=True
    )
    return out.read_bytes()


def replace(path: Path, data: bytes) -> None:
    """Write ``data`` as a new file at ``path`` (never in place: copies share inodes)."""
    path.unlink()
    path.write_bytes(data)


def append(path: Path, data: bytes) -> None:
    replace(path, path.read_bytes() + data)


def link_copy(src: Path, dst: Path) -> None:
    """A copy of a cache tree made of hard links (156 MiB of precompiled header, copied per
    case)."""
    shutil.copytree(src, dst, copy_function=os.link, symlinks=True)


def seed_torch_headers(headers: Path, tmp: Path) -> None:
    """Hard links of the precompiled headers in ``headers`` where torch itself keeps them,
    ``$TMPDIR/torchinductor_<user>/precompiled_headers``: an unguarded boot then starts as on a
    node that compiled before, instead of gcc building the 149 MiB header again (7-8 s of CPU per
    boot, and its writes beside the deadline tests). Only for boots without the guard, whose
    header torch alone looks after; a guarded boot's private directory is the guard's to make."""
    import getpass
    import re

    # as torch's default_cache_dir() names it
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    target = tmp / f"torchinductor_{user}" / "precompiled_headers"
    target.mkdir(parents=True, exist_ok=True)
    for f in headers.glob("*.h*"):
        os.link(f, target / f.name)
