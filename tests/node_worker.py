"""A worker process on a real node, for tests/test_compile_real_nodes.py (run as a subprocess,
under other users, in other PID namespaces, with other mounts).

``python node_worker.py guard DIR``: the guard's decision on the cache directory DIR, as vLLM's
first read would ask for it (the plugin's own ``private_for``), as one JSON line.
``python node_worker.py installed DIR``: the same after installing the guard on vLLM's modules.
``python node_worker.py fork DIR``: install the guard (as vLLM's engine process loads plugins),
then fork two workers that each ask for DIR; the first keeps its copy open until the second is
done and then checks it is still whole. ``python node_worker.py hold``: make this process's
boot directory, print it, and live until stdin closes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

LINES: list[str] = []


class _Keep(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        LINES.append(record.getMessage())


logging.getLogger("vllm.plancache").addHandler(_Keep())
logging.getLogger("vllm.plancache").setLevel(logging.INFO)


def tree_digest(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(path.relative_to(directory).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def decide(directory: Path) -> dict[str, Any]:
    from plancache.vllm_plugin.compile_cache import guard, torch_caches

    into, outcome = guard.private_for(directory)
    try:
        boot = str(torch_caches.boot_dir())
    except Exception as exc:
        boot = f"none: {exc}"
    return {
        "into": str(into) if into is not None else None,
        "action": getattr(outcome, "action", None),
        "reason": getattr(outcome, "reason", None),
        "detail": getattr(outcome, "detail", ""),
        "quarantined_to": getattr(outcome, "quarantined_to", ""),
        "boot": boot,
        "pid": os.getpid(),
        "digest": tree_digest(into) if into is not None and into.exists() else None,
        "lines": list(LINES),
    }


def fork(directory: Path) -> list[dict[str, Any]]:
    from plancache.vllm_plugin.compile_cache import guard, torch_caches

    assert guard.install()
    parent_boot = str(torch_caches.boot_dir())
    first_done_r, first_done_w = os.pipe()
    second_done_r, second_done_w = os.pipe()
    out_r, out_w = os.pipe()
    children = []
    for index in range(2):
        pid = os.fork()
        if pid == 0:
            os.close(out_r)
            if index == 1:
                os.read(first_done_r, 1)  # the second rank asks once the first has its copy
            report = decide(directory)
            report["parent_boot"] = parent_boot
            from torch._inductor.runtime import cache_dir_utils

            report["torch_dirs"] = [
                cache_dir_utils.default_cache_dir(),
                os.environ["TORCHINDUCTOR_CACHE_DIR"],
                os.environ["TRITON_CACHE_DIR"],
            ]
            if index == 0:
                os.write(first_done_w, b"x")
                os.read(second_done_r, 1)
                report["digest_after_other"] = (
                    tree_digest(Path(report["into"])) if report["into"] else None
                )
            else:
                os.write(second_done_w, b"x")
            os.write(out_w, (json.dumps(report) + "\n").encode())
            os._exit(0)
        children.append(pid)
    os.close(out_w)
    for pid in children:
        os.waitpid(pid, 0)
    with os.fdopen(out_r) as reports:
        return [json.loads(line) for line in reports.read().splitlines()]


def main() -> None:
    mode = sys.argv[1]
    if mode == "guard":
        print("NODE " + json.dumps(decide(Path(sys.argv[2]))), flush=True)
    elif mode == "installed":  # as vLLM loads the plugin, then its first read
        from plancache.vllm_plugin.compile_cache import guard

        installed = guard.install()
        print(
            "NODE " + json.dumps({"installed": installed, **decide(Path(sys.argv[2]))}), flush=True
        )
    elif mode == "fork":
        print("NODE " + json.dumps(fork(Path(sys.argv[2]))), flush=True)
    elif mode == "hold":
        from plancache.vllm_plugin.compile_cache import torch_caches

        print(
            "NODE " + json.dumps({"boot": str(torch_caches.boot_dir()), "pid": os.getpid()}),
            flush=True,
        )
        sys.stdin.read()


if __name__ == "__main__":
    main()
