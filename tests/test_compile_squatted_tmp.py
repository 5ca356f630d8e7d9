"""Torch compiles only into a directory the worker just made (issue 46 items 1 and 7), on vLLM
0.33's real compile path, on a node as shared as a real one.

Two real users: the victim (uid 1000) and a co-tenant (uid 1001), both in the group (2000) of a
group-writable volume (``fsGroup``: setgid, mode 2775) that holds the shared cache root and the
victim's ``TMPDIR``. ``/tmp``, ``/var/tmp`` and ``/dev/shm`` are fresh sticky tmpfs mounts in a
mount namespace of the test's own, in which the co-tenant first creates every name it can guess
(the old fixed fallbacks ``plancache-private-<uid>`` and ``plancache-cold-<uid>``, and torch's
``torchinductor_<user>``), then compiles the same toy model itself, into the shared root (the
AOT layout) and into the victim's ``$TMPDIR/torchinductor_<user>`` (the ``VLLM_USE_AOT_COMPILE=0``
layout), and appends to every kernel module it wrote a line that appends to a marker file. The
victim then boots with the guard. Torch reuses any kernel module found at its content-hash name,
so the victim runs the payload whenever its inductor cache lies where the co-tenant wrote
(the old code: ``decision=compile reason=no-private-dir``, inductor left on vLLM's shared
directory or torch's default). Asserted: the marker never appears, and every kernel module torch
loaded, and inductor's, Triton's and the precompiled header's directories at that moment, lie in
a directory of the victim's, mode 0700, whose name did not exist before the boot and does not
after it. The same with the guard unable to install (as on an unsupported vLLM).

Heavy (two real compiles per case, the three squatted nodes two at a time, each in a namespace
of its own): run under ``flock /tmp/plancache-vllm.lock``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from compile_payloads import py_line
from compile_tampers import SRC
from mount_namespaces import interpreter_reachable, keep_reachable
from plancache.keys.keyfile import generate_keypair

TESTS = Path(__file__).resolve().parent
TOY = str(TESTS / "compile_toy.py")
VICTIM, STRANGER, GROUP = 1000, 1001, 2000
VICTIM_NAME = "victim"
TEMP_PARENTS = ("/tmp", "/var/tmp", "/dev/shm")
GUESSABLE = (
    f"plancache-private-{VICTIM}",  # the old fixed fallbacks
    f"plancache-cold-{VICTIM}",
    f"torchinductor_{VICTIM_NAME}",  # torch's default cache directory
)
FRESH = re.compile(rf"plancache-(private|cold)-{VICTIM}-[0-9a-f]{{16}}")


def _needs_root_and_mounts() -> None:
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter")):
        if os.environ.get("CI") == "true":
            pytest.fail("these tests need root, mounts, unshare and nsenter (root in CI)")
        pytest.skip("needs root, mounts, unshare and nsenter")
    pytest.importorskip("vllm")


@dataclass
class Node:
    top: Path
    """Root's, outside every temporary directory (they are mounted over)."""
    holder: int
    """The process holding the mount namespace (``nsenter -t``)."""

    @property
    def volume(self) -> Path:
        return self.top / "vol"

    @property
    def root(self) -> Path:
        return self.volume / "vllm-cache"

    @property
    def tmpdir(self) -> Path:
        return self.volume / "tmp"

    @property
    def marker(self) -> Path:
        return self.volume / "marker"

    def run(self, user: int, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
        """``argv`` as ``user`` (in the volume's group, umask 002 as on an fsGroup pod) in the
        node's mount namespace."""
        return subprocess.run(
            [
                "nsenter",
                "-t",
                str(self.holder),
                "-m",
                "--",
                "setpriv",
                f"--reuid={user}",
                f"--regid={user}",
                f"--groups={GROUP}",
                "--inh-caps=-all",
                "--",
                "sh",
                "-c",
                'umask 002; exec "$@"',
                "sh",
                *argv,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            cwd="/",
        )

    def listing(self) -> dict[str, list[str]]:
        """The names in each temporary directory, as the namespace sees them."""
        out = subprocess.run(
            ["nsenter", "-t", str(self.holder), "-m", "--", "ls", "-a1", *TEMP_PARENTS],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        found: dict[str, list[str]] = {}
        current = ""
        for line in out.splitlines():
            if line.endswith(":") and line[:-1] in TEMP_PARENTS:
                current = line[:-1]
                found[current] = []
            elif line and current and line not in (".", ".."):
                found[current].append(line)
        return found


@pytest.fixture
def node() -> Iterator[Node]:
    _needs_root_and_mounts()
    interpreter_reachable()
    with _new_node() as made:
        yield made


@contextmanager
def _new_node() -> Iterator[Node]:
    """A node of its own: a mount namespace with fresh temporary directories, the volume, the
    users' homes and the key; gone on exit."""
    top = Path(tempfile.mkdtemp(prefix="plancache-squat-", dir="/srv"))
    top.chmod(0o755)
    keep = keep_reachable(TEMP_PARENTS)  # a checkout under /tmp (a CI clone) stays reachable
    holder = subprocess.Popen(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            keep[0] + "for d in " + " ".join(TEMP_PARENTS) + "; do "
            "mount -t tmpfs -o mode=1777,size=2g tmpfs $d || exit 1; done; "
            + keep[1]
            + "echo ready; exec sleep 3600",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        volume = top / "vol"
        volume.mkdir()
        os.chown(volume, 0, GROUP)
        volume.chmod(0o2775)  # an fsGroup volume: group-writable, setgid
        (volume / "tmp").mkdir()
        os.chown(volume / "tmp", 0, GROUP)
        (volume / "tmp").chmod(0o2775)  # TMPDIR on it: group-writable, not sticky
        for user in (VICTIM, STRANGER):
            home = top / f"home-{user}"
            home.mkdir(mode=0o700)
            os.chown(home, user, user)
        (top / "keys").mkdir(mode=0o755)
        generate_keypair(top / "keys" / "ci", force=False, comment="ci", env={})
        (top / "keys" / "ci.pub").chmod(0o644)
        yield Node(top, holder.pid)
    finally:
        holder.kill()
        holder.wait()
        shutil.rmtree(top, ignore_errors=True)


def _env(node: Node, user: int, name: str, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PLANCACHE_", "VLLM_", "TORCHINDUCTOR_", "TRITON_"))
        and k not in ("TMPDIR", "HOME", "USER", "LOGNAME")
    }
    env.update(
        PYTHONPATH=SRC,
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        VLLM_CACHE_ROOT=str(node.root),
        TMPDIR=str(node.tmpdir),
        HOME=str(node.top / f"home-{user}"),
        USER=name,
        LOGNAME=name,
    )
    env.update(extra)
    return env


def _toy(node: Node, user: int, env: dict[str, str]) -> dict[str, Any]:
    result = node.run(user, [sys.executable, TOY], env)
    lines = [line for line in result.stdout.splitlines() if line.startswith("COMPILE_TOY ")]
    assert result.returncode == 0 and lines, result.stderr[-4000:]
    report: dict[str, Any] = json.loads(lines[0][len("COMPILE_TOY ") :])
    report["stderr"] = result.stderr
    return report


def _squat(node: Node) -> None:
    """The co-tenant takes every guessable name in every temporary directory (before the victim
    ever booted), open to all, so whatever the victim puts there is the co-tenant's too."""
    script = "; ".join(
        f"mkdir -p {parent}/{name} && chmod 0777 {parent}/{name}"
        for parent in (*TEMP_PARENTS, str(node.tmpdir))
        for name in GUESSABLE
    )
    result = node.run(STRANGER, ["sh", "-c", script], {"PATH": os.environ["PATH"]})
    assert result.returncode == 0, result.stderr


PLANT = """
import os, sys
from pathlib import Path
root, payload, *squatted = sys.argv[1:]
planted = 0
for path in Path(root).rglob("*.py"):
    if len(path.parent.name) != 2:
        continue  # inductor's kernel modules: <inductor cache>/<2 chars>/<hash>.py
    data = path.read_bytes() + payload.encode()
    for top in [path.parent.parent, *map(Path, squatted)]:
        target = top / path.parent.name / path.name
        target.parent.mkdir(mode=0o777, exist_ok=True)
        target.unlink(missing_ok=True)
        target.write_bytes(data)
        os.chmod(target, 0o666)
        os.chmod(target.parent, 0o777)
        planted += 1
print(planted)
"""


def _plant(node: Node, aot: bool) -> int:
    """The co-tenant compiles the victim's model, configured as the victim's worker is when it
    has no private place (torch's caches off: vLLM hashes that into the AOT path), into the
    shared root, then appends the payload to every kernel module it wrote and puts a copy at
    the same name (kernel names are content hashes, the same in any directory) in every
    ``torchinductor_<user>`` it squatted: wherever the victim's torch would look. Returns how
    many modules were planted."""
    layout = {} if aot else {"VLLM_USE_AOT_COMPILE": "0"}
    # the <10 hex> layout cannot save with torch's caches off: the co-tenant compiles its
    # kernels into a directory of its own instead, and plants them from there
    source = node.root if aot else node.tmpdir / "stranger-inductor"
    where = {} if aot else {"TORCHINDUCTOR_CACHE_DIR": str(source)}
    extra = {} if aot else {"VLLM_DISABLE_COMPILE_CACHE": "1"}
    report = _toy(
        node,
        STRANGER,
        _env(node, STRANGER, "stranger", COMPILE_TOY_CACHES_OFF="1", **layout, **where, **extra),
    )
    assert report["correct"], (report["error"], report["stderr"][-3000:])
    payload = py_line(node.marker, "co-tenant kernel ran as the victim").decode()
    squatted = [f"{parent}/{GUESSABLE[2]}" for parent in (*TEMP_PARENTS, str(node.tmpdir))]
    result = node.run(
        STRANGER,
        [sys.executable, "-c", PLANT, str(source), payload, *squatted],
        {"PATH": os.environ["PATH"]},
    )
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip())


def _private_ancestor(chain: list[list[Any]], before: dict[str, list[str]]) -> str | None:
    """The fresh root in ``chain`` (a path's directories, from the path up, with uid and mode)
    if it is the victim's, mode 0700, in a temporary directory, under a name that did not exist
    before the boot; None otherwise."""
    for path, uid, mode in chain:
        parent, name = os.path.split(path)
        if FRESH.fullmatch(name) and parent in TEMP_PARENTS:
            fresh = uid == VICTIM and mode == 0o700 and name not in before.get(parent, [])
            return path if fresh else None
    return None


def _victim(node: Node, aot: bool, **extra: str) -> tuple[dict[str, Any], dict[str, list[str]]]:
    layout = {} if aot else {"VLLM_USE_AOT_COMPILE": "0"}
    env = _env(
        node,
        VICTIM,
        VICTIM_NAME,
        PLANCACHE_COMPILE_CACHE="1",
        PLANCACHE_TRUSTED_KEYS=str(node.top / "keys" / "ci.pub"),
        **layout,
        **extra,
    )
    before = node.listing()
    return _toy(node, VICTIM, env), before


def _assert_private(run: Squatted) -> None:
    report, before = run.report, run.before
    assert run.marker is None, run.marker  # the old code: it ran, both layouts
    assert report["correct"] and report["error"] is None, report["stderr"][-3000:]
    assert report["kernels_loaded"], "torch loaded no kernel module: nothing was compiled"
    roots = set()
    for name in ("inductor_cache_dir", "triton_cache_dir", "header_dir"):
        where = _private_ancestor(report["chains"][name], before)
        assert where, (name, report[name], report["chains"][name])
        roots.add(where)
    for chain in report["kernel_chains"]:
        roots.add(_private_ancestor(chain, before) or f"outside: {chain[0]}")
    assert len(roots) == 1 and None not in roots, roots  # one fresh root: this process's
    parent, name = os.path.split(roots.pop())
    assert name not in run.after[parent]  # removed at exit: it lived for this boot alone


@dataclass
class Squatted:
    """What one squatted node showed: the modules the co-tenant planted, then the victim's boot
    with the temporary directories' names before and after it and the marker's text (None: the
    payload never ran), all read while the node still stood."""

    planted: int
    report: dict[str, Any]
    before: dict[str, list[str]]
    after: dict[str, list[str]]
    marker: str | None


def _squatted(aot: bool, **victim: str) -> Squatted:
    """A node of its own: the co-tenant squats and plants, then the victim boots."""
    with _new_node() as node:
        _squat(node)
        planted = _plant(node, aot)
        report, before = _victim(node, aot, **victim)
        marker = node.marker.read_text() if node.marker.exists() else None
        return Squatted(planted, report, before, node.listing(), marker)


SQUATTED = {
    "aot1": lambda: _squatted(aot=True),
    "aot0": lambda: _squatted(aot=False),
    "unsupported": lambda: _squatted(aot=True, COMPILE_TOY_UNSUPPORTED="1"),
}
"""The squatted nodes, each a co-tenant's compile then the victim's (two real compiles)."""


@pytest.fixture(scope="module")
def squatted() -> Iterator[dict[str, Future[Squatted]]]:
    """Every squatted node, started on the first test that needs one, two at a time: each is a
    namespace, volume and homes of its own, and each node's two compiles stay in order, but one
    node's pair needs nothing of another's (one after the other, one compile at a time, they
    took two and a half minutes with a core idle). Each test takes its own node's result."""
    _needs_root_and_mounts()
    interpreter_reachable()
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {name: pool.submit(run) for name, run in SQUATTED.items()}


@pytest.mark.parametrize("aot", ["aot1", "aot0"])
def test_a_squatted_tmp_and_a_group_writable_root_never_run_a_planted_kernel(
    squatted: dict[str, Future[Squatted]], aot: str
) -> None:
    run = squatted[aot].result()
    assert run.planted > 0
    _assert_private(run)
    said = run.report["stderr"]
    # the cache root's own place was refused, and said why (its group-writable chain)
    assert "compile-cache private directory=" in said and "lets another user" in said, said[-3000:]


def test_with_the_guard_not_installed_torch_still_compiles_only_into_a_fresh_private_root(
    squatted: dict[str, Future[Squatted]],
) -> None:
    run = squatted["unsupported"].result()
    assert run.planted > 0
    assert "compile-cache guard not installed" in run.report["stderr"], run.report["stderr"][-3000:]
    _assert_private(run)


def _remount(node: Node, options: str) -> None:
    """Every temporary directory remounted with ``options`` (in the node's namespace)."""
    script = "; ".join(f"mount -o remount,{options} {parent}" for parent in TEMP_PARENTS)
    subprocess.run(["nsenter", "-t", str(node.holder), "-m", "--", "sh", "-ec", script], check=True)


def _assert_eager_and_said(report: dict[str, Any]) -> None:
    """The model ran, eagerly: nothing compiled (no kernel module loaded), no cache read, and
    the worker said why in one ERROR line."""
    assert report["correct"] and report["error"] is None, report["stderr"][-3000:]
    assert report["kernels_loaded"] == [], report["kernels_loaded"]
    errors = [line for line in report["stderr"].splitlines() if line.startswith("ERROR")]
    assert any("reason=no-private-dir" in line and "eagerly" in line for line in errors), errors
    assert "Traceback" not in report["stderr"], report["stderr"][-3000:]


def test_with_every_temporary_directory_full_the_model_runs_eagerly_never_crashes(
    node: Node,
) -> None:
    """A co-tenant fills the inodes of every shared temporary directory: the victim has no
    private place and no scratch. Torch then compiles nothing and the model runs eagerly (the
    first cut raised from torch's cache directory, which ``torch.compile`` reads when vLLM
    builds the model: the boot died; the old code compiled into the shared root)."""
    _remount(node, "nr_inodes=64")
    fill = " ".join(
        f"i=0; while touch {parent}/f$i 2>/dev/null; do i=$((i+1)); done;"
        for parent in TEMP_PARENTS
    )
    filled = node.run(STRANGER, ["sh", "-c", fill], {"PATH": os.environ["PATH"]})
    assert filled.returncode == 0, filled.stderr
    report, _ = _victim(node, aot=True)
    _assert_eager_and_said(report)
    assert "No space left on device" in report["stderr"]


def test_with_every_temporary_directory_noexec_the_model_runs_eagerly_never_crashes(
    node: Node,
) -> None:
    """Every temporary directory ``noexec`` (a common pod layout) and the cache root shared:
    the cold scratch is never put on a ``noexec`` filesystem (the first cut did, and the cold
    compile failed to map the shared object it built there: the boot died)."""
    _remount(node, "noexec")
    report, _ = _victim(node, aot=True)
    _assert_eager_and_said(report)
    assert "noexec" in report["stderr"]
