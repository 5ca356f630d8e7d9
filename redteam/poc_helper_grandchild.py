"""PoC 3: a credential helper that forks a grandchild holding its stdout.

Tried: docker config `credsStore: gc`, `docker-credential-gc` on PATH = `sleep 600 & exec sleep
600` (the helper never answers; a background child inherits the stdout pipe). A registry on
loopback that wants a login (a bearer challenge), the store opened with a 40 s budget.
Expected (SECURITY.md): the helper "is killed when it outlives 5 s or the operation".
Happened (new code): the helper is killed at 5 s, then the reap waits for its pipe to close
(asyncio's wait() waits for the pipes), which the grandchild holds for 600 s: the read ends only
at the operation's deadline (40 s here, the CLI's 120 s by default), not at 5 s; the
grandchild (and a task draining its pipe) outlive the operation.

Run: PYTHONPATH=src:tests python redteam/poc_helper_grandchild.py
"""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from registry_stub import RegistryStub

from plancache.storage.store import open_store

home = Path(tempfile.mkdtemp())
pids = home / "pids"
program = home / "bin" / "docker-credential-gc"
program.parent.mkdir()
program.write_text(f"#!/bin/sh\nsleep 600 &\necho $! >> {pids}\necho $$ >> {pids}\nexec sleep 600\n")
program.chmod(program.stat().st_mode | stat.S_IXUSR)
os.environ["PATH"] = f"{program.parent}{os.pathsep}{os.environ['PATH']}"
os.environ["DOCKER_CONFIG"] = str(home)
(home / "config.json").write_text(json.dumps({"credsStore": "gc"}))
registry = RegistryStub()
registry.state.bearer = base64.b64encode(b"ci:x").decode()
started = time.monotonic()
result = open_store(registry.url("team/plans"), timeout=40).fetch("0123456789abcdef")
took = time.monotonic() - started
alive = []
for pid in pids.read_text().split():
    try:
        os.kill(int(pid), 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state != "Z":
            alive.append(pid)
    except ProcessLookupError:
        pass
print(json.dumps({
    "seconds": round(took, 1),
    "error": result.error.reason.value + ": " + result.error.detail if result.error else None,
    "helper processes still alive": alive,
}))
for pid in alive:
    os.kill(int(pid), 9)
registry.stop()
