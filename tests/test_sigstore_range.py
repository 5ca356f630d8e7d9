"""The ``[sigstore]`` extra is a range (``>=4.5,<5``), so its oldest release is tested too.

The suite runs on the newest release in the range (the test venv's); here the oldest, taken
from the extra's own lower bound, is installed with ``pip --target`` into a directory that
shadows the venv's copy on ``PYTHONPATH``, and the keyless files that need no server (real
public-good and staging bundles, the local stack in process) run again on it. The index is asked
within a bound: unreachable, the test skips (under ``CI=true`` it fails, as every tier does).
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")

ROOT = Path(__file__).resolve().parents[1]
FILES = (
    "tests/test_keyless_public_bundles.py",
    "tests/test_keyless_envelopes.py",
    "tests/test_keyless_retired_roots.py",
    "tests/test_keyless_identity_lines.py",
)
"""Keyless files that run on the oldest release: real bundles, roots at chosen times, lines."""
PIP_BUDGET = 180.0
PIP_INSTALL = (sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-deps")


def _oldest_in_range() -> str:
    """The extra's lower bound, written as the release it names (``>=4.5`` -> ``4.5.0``)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (raw,) = extras["optional-dependencies"]["sigstore"]
    (lower,) = [s.version for s in Requirement(raw).specifier if s.operator == ">="]
    parts = lower.split(".")
    return ".".join(parts + ["0"] * (3 - len(parts)))


def _pip_target(target: Path, *requirements: str) -> None:
    """``pip install --no-deps --target``, bounded; the index unreachable or slow skips."""
    try:
        got = subprocess.run(
            [*PIP_INSTALL, "--target", str(target), *requirements],
            capture_output=True,
            text=True,
            timeout=PIP_BUDGET,
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"the package index did not answer within {PIP_BUDGET:.0f} s")
    if got.returncode != 0:
        pytest.skip(f"{' '.join(requirements)} not installed: {got.stderr.strip()[-300:]}")


def _unmet(dist_info: Path) -> list[str]:
    """The requirements of the release in ``dist_info`` that this venv does not meet (4.5.0
    needs pyOpenSSL, which 4.5.1 dropped): installed beside it, nothing else changes."""
    unmet = []
    for raw in metadata.PathDistribution(dist_info).requires or []:
        req = Requirement(raw)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            unmet.append(str(req))
            continue
        if not req.specifier.contains(have, prereleases=True):
            unmet.append(str(req))
    return unmet


def test_the_keyless_checks_hold_on_the_oldest_sigstore_in_range(tmp_path: Path) -> None:
    oldest = _oldest_in_range()
    target = tmp_path / "oldest"
    _pip_target(target, f"sigstore=={oldest}")
    unmet = _unmet(target / f"sigstore-{oldest}.dist-info")
    if unmet:
        _pip_target(target, *unmet)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(target), str(ROOT / "src"), str(ROOT / "tests")]),
    }
    version = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m; print(m.version('sigstore'))"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.strip()
    assert version == oldest
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", *FILES],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:]
