"""vLLM's local plan directory: where vLLM looks, and plancache's primary cache.

The directory is resolved exactly as vLLM 0.33 resolves it, so plans plancache pulls are the
ones vLLM would find, and vice versa. A plan and its sidecar are written in that order, each
atomically: a crash between the two leaves a plan whose old or missing signature fails
verification, which costs a profiling run, never a wrong plan.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ...trust.envelope import MAX_SIG_OBJECT_BYTES
from ...trust.errors import PlanCacheError
from ...trust.plans.plan import (
    MAX_PLAN_BYTES,
    fingerprint_of_plan_name,
    plan_name,
    sidecar_of,
    sig_name,
)
from ...trust.result import PlanResult
from .files import fsync_dir, read_capped, write_atomic

PLAN_SUBDIR = "startup_plan"


def vllm_cache_root(env: Mapping[str, str] = os.environ) -> Path:
    """``VLLM_CACHE_ROOT``, else ``$XDG_CACHE_HOME/vllm``, else ``~/.cache/vllm`` (as vllm.envs)."""
    root = env.get("VLLM_CACHE_ROOT")
    if root:
        return Path(os.path.expanduser(root))
    xdg = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(os.path.expanduser(xdg)) / "vllm"


def default_plan_dir(env: Mapping[str, str] = os.environ) -> Path:
    return vllm_cache_root(env) / PLAN_SUBDIR


EVIDENCE_NAME = "plancache-evidence-{fp}.json"
"""Beside a plan the plugin saved: how its boot measured it, for ``sign`` to sign (issue 49)."""


class LocalPlanDir:
    """A directory of ``startup_plan_<fp>.json`` files with ``.sig`` sidecars."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def __str__(self) -> str:
        return str(self.path)

    def fingerprints(self) -> list[str]:
        """Fingerprints of the plan files present; any other name is ignored."""
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return []
        return sorted(fp for fp in map(fingerprint_of_plan_name, names) if fp is not None)

    def read(self, fingerprint: str) -> tuple[bytes | None, bytes | None]:
        """(plan bytes, sidecar bytes), each None when absent; reads are capped, never trusted."""
        # os.path.join, not Path's "/": two Path objects a plan cost ~10 us of a 10,000-plan verify
        plan_path = os.path.join(os.fspath(self.path), plan_name(fingerprint))
        plan = read_capped(plan_path, MAX_PLAN_BYTES)
        if plan is None:
            return None, None
        return plan, read_capped(sidecar_of(plan_path), MAX_SIG_OBJECT_BYTES)

    def write(
        self, fingerprint: str, plan_bytes: bytes, sig_bytes: bytes | None, sync: bool = True
    ) -> None:
        """Write the plan, then its sidecar, each atomically.

        ``sync=False`` is for batches (a bulk pull): the caller calls :meth:`sync` once after
        all writes instead of one directory fsync per file. A crash before that can lose some
        renames, never a file's content: a plan whose sidecar did not survive fails
        verification and costs a profiling run.
        """
        write_atomic(self.path / plan_name(fingerprint), plan_bytes, sync_dir=sync)
        if sig_bytes is not None:
            write_atomic(self.path / sig_name(fingerprint), sig_bytes, sync_dir=sync)

    def sync(self) -> None:
        fsync_dir(self.path)

    def read_evidence(self, fingerprint: str) -> bytes | None:
        """The plugin's unsigned account of how the plan was measured
        (``plancache-evidence-<fp>.json``, :func:`plancache.trust.plans.evidence.evidence_for`
        judges it); None when absent or unreadable."""
        try:
            return read_capped(self.path / EVIDENCE_NAME.format(fp=fingerprint), 16384)
        except PlanCacheError:
            return None

    def write_evidence(self, fingerprint: str, data: bytes) -> None:
        write_atomic(self.path / EVIDENCE_NAME.format(fp=fingerprint), data)

    def write_sig(self, fingerprint: str, sig_bytes: bytes) -> None:
        write_atomic(self.path / sig_name(fingerprint), sig_bytes)

    def fetch_many(
        self, fingerprints: Sequence[str], on_done: Callable[[int], None] | None = None
    ) -> list[PlanResult]:
        """The same shape a store returns: raw bytes per fingerprint, or the error reading them."""
        results = []
        for fp in fingerprints:
            try:
                plan, sig = self.read(fp)
                results.append(PlanResult(fp, "local", plan_bytes=plan, sig_bytes=sig))
            except PlanCacheError as exc:
                results.append(PlanResult(fp, "local", error=exc))
            if on_done:
                on_done(1)
        return results
