"""Attacks on the compile-cache guard itself, each booted through vLLM's real compile path
(issue 17): a local writer at the moment vLLM reads, a planted ``$TMPDIR`` entry under
``VLLM_DISABLE_COMPILE_CACHE=1``, a cache volume on its own mount, planted symlinks at the names
plancache writes, two ranks pulling at once, a restart after a pull and a re-pull after a
quarantine. Each function prepares one base directory, boots, and returns the boot's report
with what the test asserts on; test_compile_cache_vllm.py runs them beside the other scenarios.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import compile_payloads as P
from compile_boots import AOT0, ROOT_NAME, boot, cache_dir, quarantined
from compile_tampers import t_rank_pickle
from store_servers import AWS_ENV


def rewrite_at_read(top: Path, base: Path, store: dict[str, str]) -> dict[str, Any]:
    """``rank_0_0/model`` is a hard link to a file outside the cache (same bytes, so it
    verifies); its owner rewrites that inode with a payload right after vLLM opened the model
    file, before torch unpickles it (compile_toy's ``COMPILE_TOY_REWRITE``)."""
    P.link_copy(top / "signed" / ROOT_NAME, base / ROOT_NAME)
    model = cache_dir(base) / "rank_0_0" / "model"
    outside = base / "outside-model"
    outside.write_bytes(model.read_bytes())
    model.unlink()
    os.link(outside, model)
    (base / "payload").write_bytes(P.pickle_payload(base / "marker"))
    report = boot(base, COMPILE_TOY_REWRITE=f"{outside}|{base / 'payload'}")
    fired = Path(f"{outside}.fired")
    report["read_path"] = fired.read_text() if fired.exists() else None
    report["outside_is_payload"] = outside.read_bytes() == (base / "payload").read_bytes()
    return report


def disabled_planted(guard: bool) -> Callable[[Path, Path, dict[str, str]], dict[str, Any]]:
    """``VLLM_DISABLE_COMPILE_CACHE=1`` (``VLLM_USE_AOT_COMPILE=0``): inductor's cache of an earlier
    compile, its generated modules carrying a payload, planted in ``$TMPDIR/torchinductor_<user>``
    (a world-writable /tmp), where torch looks by default."""

    def run(top: Path, base: Path, store: dict[str, str]) -> dict[str, Any]:
        planted = base / "tmp" / f"torchinductor_{os.environ.get('USER') or 'root'}"
        shutil.copytree(
            cache_dir(top / "signed0", aot=False) / "rank_0_0" / "inductor_cache", planted
        )
        for f in glob.glob(str(planted / "*" / "*.py")):
            P.append(Path(f), P.py_line(base / "marker"))
        # the header torch would have from an earlier boot (not what the control shows)
        if not guard:
            P.seed_torch_headers(
                top / "signed" / ROOT_NAME / "plancache-private" / "headers", base / "tmp"
            )
        return boot(base, guard, VLLM_DISABLE_COMPILE_CACHE="1", **AOT0)

    return run


def planted_links(top: Path, base: Path, store: dict[str, str]) -> dict[str, Any]:
    """Symlinks at the predictable names plancache writes under the root (the quarantine and
    private roots, the lock and sidecar of vLLM's ``<10 hex>`` directory), pointing at a victim
    file and an outside directory; the AOT cache is tampered so that the guard quarantines, and
    the boot signs what it compiled (a signing key is set). The sidecar and temporaries of a
    sign or pull are covered without vLLM in test_compile_cache_guard.py."""
    P.link_copy(top / "signed" / ROOT_NAME, base / ROOT_NAME)
    d = cache_dir(base)
    t_rank_pickle(d, base / "marker")
    victim, outside = base / "victim", base / "outside"
    victim.write_bytes(b"victim\n")
    outside.mkdir()
    root = base / ROOT_NAME
    shutil.rmtree(root / "plancache-private", ignore_errors=True)  # the cold boot's, copied along
    (root / "plancache-quarantine").symlink_to(outside)
    (root / "plancache-private").symlink_to(outside)
    # vLLM's debug directory
    ten = Path(glob.glob(str(root / "torch_compile_cache" / ("[0-9a-f]" * 10)))[0])
    for name in (ten.name + ".plancache.lock", ten.name + ".plancache.sig"):
        ten.with_name(name).unlink(missing_ok=True)  # the cold boot's lock, copied along
        ten.with_name(name).symlink_to(victim)
    report = boot(base, PLANCACHE_SIGNING_KEY=str(top / "keys" / "key"))
    report["victim"] = victim.read_bytes()
    report["outside"] = sorted(os.listdir(outside))
    return report


def two_ranks_then_restart(top: Path, base: Path, store: dict[str, str]) -> dict[str, Any]:
    """Two processes of one node boot at once on an empty root with the same store (a counting
    S3 server); then the node restarts with the store still configured."""
    base.joinpath(ROOT_NAME).mkdir()
    with ThreadPoolExecutor(max_workers=2) as pool:
        ranks = list(pool.map(lambda _: boot(base, **store), range(2)))
    restart = boot(base, **store)
    return {"ranks": ranks, "restart": restart, "quarantine": quarantined(base), "correct": True}


def repull_after_quarantine(top: Path, base: Path, store: dict[str, str]) -> dict[str, Any]:
    """The node's local cache was tampered; the store holds the good one."""
    P.link_copy(top / "signed" / ROOT_NAME, base / ROOT_NAME)
    t_rank_pickle(cache_dir(base), base / "marker")
    return boot(base, **store)


@contextlib.contextmanager
def signed_cache_on_tmpfs(top: Path, base: Path, *remount: str) -> Iterator[str | None]:
    """The signed cache copied onto a tmpfs mounted at ``torch_compile_cache/`` (then remounted
    with ``remount`` options, if any); yields None, or why the mount is not possible here."""
    mount = base / ROOT_NAME / "torch_compile_cache"
    mount.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        yield f"cannot mount a tmpfs here: {done.stderr.strip()}"
        return
    try:
        shutil.copytree(
            top / "signed" / ROOT_NAME / "torch_compile_cache", mount, dirs_exist_ok=True
        )
        if remount:
            done = subprocess.run(
                ["mount", "-o", ",".join(("remount", *remount)), str(mount)],
                capture_output=True,
                text=True,
            )
        yield (
            None
            if done.returncode == 0
            else f"cannot remount the tmpfs {remount}: {done.stderr.strip()}"
        )
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def own_mount(top: Path, base: Path, store: dict[str, str]) -> dict[str, Any]:
    """``torch_compile_cache/`` is its own tmpfs (a fleet's shared volume), holding a tampered
    cache: the quarantine must stay on that mount, and the boot must compile, not stop."""
    with signed_cache_on_tmpfs(top, base) as why_not:
        if why_not:
            return {"skipped": why_not}
        t_rank_pickle(cache_dir(base), base / "marker")
        report = boot(base)
        here = (
            base / ROOT_NAME / "torch_compile_cache" / "torch_aot_compile" / "plancache-quarantine"
        )
        report["quarantine_here"] = sorted(os.listdir(here)) if here.exists() else []
        return report


def read_only_mount(top: Path, base: Path, store: dict[str, str]) -> dict[str, Any]:
    """``torch_compile_cache/`` is a read-only tmpfs holding the valid signed cache (an image
    layer, a volume mounted ro): vLLM can load it there, so the guarded boot loads it too."""
    with signed_cache_on_tmpfs(top, base, "ro") as why_not:
        return {"skipped": why_not} if why_not else boot(base)


def private_dir_setting(top: Path, base: Path, store: dict[str, str]) -> dict[str, Any]:
    """A read-only root's node: ``torch_compile_cache/`` a read-only mount, ``$TMPDIR`` a ``noexec``
    tmpfs, ``plancache-private`` another user's; ``PLANCACHE_PRIVATE_DIR`` names an exec-capable
    directory of the worker's: the verified copy goes there, where its ``.so`` files can be
    mapped."""
    with signed_cache_on_tmpfs(top, base, "ro") as why_not:
        if why_not:
            return {"skipped": why_not}
        (base / ROOT_NAME / "plancache-private").mkdir(mode=0o700)
        os.chown(base / ROOT_NAME / "plancache-private", 1001, 1001)
        (base / "tmp").mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64m,noexec", "tmpfs", str(base / "tmp")],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            return {"skipped": f"cannot mount a noexec tmpfs here: {done.stderr.strip()}"}
        try:
            report = boot(base, PLANCACHE_PRIVATE_DIR=str(base / "exec-private"))
        finally:
            subprocess.run(["umount", "-l", str(base / "tmp")], check=False)
        report["private_dir"] = str(base / "exec-private")
        return report


def store_env(endpoint: str, prefix: str) -> dict[str, str]:
    """A loopback S3 store for a boot, with a roomy budget: these boots check what was pulled, not
    when (the 3 s default timed out while a loaded machine was still building the SDK client)."""
    return {
        **AWS_ENV,
        "PLANCACHE_URL": f"s3://{prefix}",
        "PLANCACHE_STORAGE_OPTIONS": f"endpoint_url={endpoint}",
        "PLANCACHE_TIMEOUT": "30",
    }


ATTACKS: dict[str, tuple[Callable[[Path, Path, dict[str, str]], dict[str, Any]], str | None]] = {
    "rewrite-at-read": (rewrite_at_read, None),
    "disabled-planted": (disabled_planted(True), None),
    "disabled-planted-control": (disabled_planted(False), None),
    "own-mount": (own_mount, None),
    "read-only-mount": (read_only_mount, None),
    "private-dir-setting": (private_dir_setting, None),
    "planted-links": (planted_links, None),
    "two-ranks": (two_ranks_then_restart, "bucket/ranks"),
    "repull": (repull_after_quarantine, "bucket/repull"),
}
"""name -> (the attack, the store prefix it pulls from, or None for no store)."""
