"""The extras install beside each other, beside boto3 and beside what a vLLM image holds.

``pip install 'plancache[s3]' boto3`` once ended in ResolutionImpossible: pip takes the newest
boto3 first, whose botocore is outside the narrow window aiobotocore pins, and s3fs (2026.9)
and aiobotocore (3.10) have no ``boto3`` extra any more that would bound it. ``[s3]`` bounds
boto3 to that window itself. What keeps it so:

* network-free, always: ``[s3]``'s boto3 bound is the installed aiobotocore's botocore window
  (boto3 X.Y.Z needs botocore >= X.Y.Z, so the two windows must be the same); pip resolves
  every extra plus boto3 with ``--no-index`` against this environment (the test venv is a
  vLLM image's packages plus requirements/test-pins.txt) and would install nothing but
  plancache; no package our extras pull in breaks a requirement of vLLM itself (vLLM is
  installed ``--no-deps``, so pip check cannot say);
* against the configured index, when it answers in time: the one-command install itself,
  resolved from scratch (``--dry-run --ignore-installed``). It is bounded: a quick probe of the
  index first (``pip index versions``, INDEX_PROBE_BUDGET), then the resolution within what is
  left of INDEX_BUDGET; an index that is unreachable or slow skips the test with the reason,
  never holds the suite (a slow index once made this one test take 13 minutes).
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("s3", "gcs", "azure", "oci", "awskms", "gcpkms", "pkcs11", "sigstore")
"""Every extra but [test] (tools) and [vllm] (checked against vLLM's own requirements)."""
NO_NETWORK = (
    "NewConnectionError",
    "Max retries exceeded",
    "Could not fetch URL",
    "Network is unreachable",
    "Temporary failure in name resolution",
    "No matching distribution found for setuptools",
    "Read timed out",
    "ReadTimeoutError",
    "Connection refused",
    "ConnectTimeoutError",
)
INDEX_BUDGET = 60.0
"""Seconds the whole index check may take, probe included (issue 21: bounded, ≤ 60 s)."""
INDEX_PROBE_BUDGET = 15.0
"""Seconds the probe may take: an index slower than this would not resolve in INDEX_BUDGET."""


def extra_requirements(extra: str) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in project["optional-dependencies"][extra]]


def pip_resolve(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> tuple[int, dict, str]:
    """``pip install --dry-run --report`` of ``args`` from the repository root: (rc, report,
    log)."""
    report = ROOT / ".pytest_cache" / "pip-report.json"
    report.parent.mkdir(exist_ok=True)
    report.unlink(missing_ok=True)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--dry-run",
            "--report",
            str(report),
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    log = "\n".join(
        line for line in (proc.stdout + proc.stderr).splitlines() if "is ignored" not in line
    )
    return proc.returncode, json.loads(report.read_text()) if report.exists() else {}, log


def installs(report: dict) -> dict[str, str]:
    return {
        canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
        for i in report.get("install", [])
    }


def test_s3_bounds_boto3_to_aiobotocores_botocore_window() -> None:
    (boto3,) = [r for r in extra_requirements("s3") if r.name == "boto3"]
    (botocore,) = [
        Requirement(r)
        for r in metadata.requires("aiobotocore") or []
        if Requirement(r).name == "botocore"
    ]
    assert boto3.specifier == botocore.specifier, (
        f"[s3] bounds boto3 to {boto3.specifier}, aiobotocore {metadata.version('aiobotocore')} "
        f"pins botocore to {botocore.specifier}: move the bound in pyproject.toml with aiobotocore"
    )
    assert metadata.version("boto3") in boto3.specifier


def test_every_extra_and_boto3_resolve_beside_this_image_without_moving_anything() -> None:
    code, report, log = pip_resolve(
        "--no-index", "--no-build-isolation", f".[{','.join(EXTRAS)}]", "boto3"
    )
    assert code == 0, log[-3000:]
    assert set(installs(report)) == {"plancache"}, installs(report)


def _closure(requirements: list[Requirement]) -> Iterator[str]:
    """Names of the installed distributions ``requirements`` pull in (markers evaluated)."""
    seen: set[str] = set()
    todo = list(requirements)
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            sub = Requirement(text)
            extras = req.extras or {""}
            if sub.marker is None or any(
                sub.marker.evaluate({**default_environment(), "extra": e}) for e in extras
            ):
                todo.append(sub)
        yield name


def test_our_extras_meet_vllms_own_requirements() -> None:
    ours = set(_closure([r for extra in EXTRAS for r in extra_requirements(extra)]))
    vllm_spec = extra_requirements("vllm")[0]
    assert metadata.version("vllm") in vllm_spec.specifier
    broken = []
    for text in metadata.requires("vllm") or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(
            {**default_environment(), "extra": ""}
        ):
            continue
        name = canonicalize_name(req.name)
        if name in ours and metadata.version(name) not in req.specifier:
            broken.append(f"{name} {metadata.version(name)} (vLLM wants {req.specifier})")
    assert not broken and {"aiohttp", "requests"} <= ours


def resolve_against_index(
    *args: str, env: dict[str, str] | None = None, budget: float = INDEX_BUDGET
) -> tuple[dict, str]:
    """``pip_resolve(args)`` against the configured index within ``budget`` seconds in all,
    or ``pytest.skip`` saying why (unreachable, or too slow to answer in time)."""
    started = time.monotonic()
    probe_budget = min(INDEX_PROBE_BUDGET, budget)
    try:
        probe = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "index",
                "versions",
                "boto3",
                "--timeout",
                str(int(probe_budget / 3) or 1),
                "--retries",
                "0",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=probe_budget,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.skip(
            f"the configured package index did not answer a probe within {probe_budget:g} s"
        )
    spent = time.monotonic() - started
    if probe.returncode != 0:
        pytest.skip(
            "the configured package index cannot be reached: "
            f"{probe.stderr.strip().splitlines()[-1:]}"
        )
    if any(marker in probe.stderr for marker in NO_NETWORK):
        pytest.skip(
            "the configured package index is slow or partly unreachable (the probe retried)"
        )
    left = budget - spent
    try:
        code, report, log = pip_resolve(
            "--ignore-installed",
            "--no-build-isolation",
            "--timeout",
            "15",
            "--retries",
            "1",
            *args,
            timeout=left,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.skip(
            f"the configured package index did not resolve {' '.join(args)} within {budget:g} s"
        )
    if code != 0 and any(marker in log for marker in NO_NETWORK):
        pytest.skip("the configured package index cannot be reached")
    assert code == 0, log[-3000:]
    return report, log


def test_an_unanswering_index_skips_the_index_check_within_its_budget() -> None:
    """A black-holed index (connections accepted, never answered) is a skip with a reason,
    not a wait of pip's retries times every package (it was 13 minutes on a slow index)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)
        env.update(
            PIP_CONFIG_FILE=os.devnull,
            PIP_NO_CACHE_DIR="1",
            PIP_INDEX_URL=f"http://127.0.0.1:{hole.getsockname()[1]}/simple",
        )
        with pytest.raises(pytest.skip.Exception, match="package index"):
            resolve_against_index(".[s3]", "boto3", env=env, budget=9)


def test_s3_and_boto3_resolve_from_the_configured_index_in_one_command() -> None:
    report, _ = resolve_against_index(".[s3]", "boto3")
    got = installs(report)
    assert {"plancache", "s3fs", "aiobotocore", "boto3", "botocore"} <= set(got)
    (boto3,) = [r for r in extra_requirements("s3") if r.name == "boto3"]
    assert got["boto3"] in boto3.specifier
