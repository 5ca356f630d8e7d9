"""The public Python API: the README's example runs as written, and the root stays light."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import FP, make_signer, plan_bytes
from plancache.storage.localdir import LocalPlanDir
from plancache.trust.keys import openssh_line
from plancache.trust.plan import Plan, plan_name, render_plan
from plancache.trust.signing import sign_plan
from plancache.pipeline.resolver import utcnow

ROOT = Path(__file__).resolve().parents[1]
TAMPERED = "fedcba9876543210"


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Python API", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's Python API section has no python example"
    return match.group(1)


def test_readme_python_api_example_runs(tmp_path: Path) -> None:
    signer = make_signer()
    (tmp_path / "trusted-keys").write_text(openssh_line(signer.public, "ci") + "\n")
    store = LocalPlanDir(tmp_path / "bucket" / "plans")
    for fp in (FP, TAMPERED):
        data = plan_bytes(fp)
        store.write(fp, data, sign_plan(plan_name(fp), data, signer, utcnow()))
    # an attacker rewrites one plan in the store; its sidecar stays as signed
    store.write(TAMPERED, render_plan(Plan(TAMPERED, 69 * 2**30, 70 * 2**30)), None)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PLANCACHE_URL": store.path.as_uri(),
           "VLLM_CACHE_ROOT": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", readme_example()], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith(f"{FP} valid ok {signer.keyid} ") for line in lines), lines
    assert any(line.startswith(f"{TAMPERED} invalid digest-mismatch") for line in lines), lines
    assert f"{FP} pulled" in lines and f"{TAMPERED} rejected: digest-mismatch" in lines
    pulled = tmp_path / "cache" / "startup_plan"
    assert sorted(p.name for p in pulled.iterdir()) == [plan_name(FP), plan_name(FP) + ".sig"]
    assert f"{FP} kv_cache_memory_bytes {20 * 2**30} signed by {signer.keyid}" in lines


def test_public_names_resolve_and_import_stays_light() -> None:
    code = (
        "import sys, plancache\n"
        "heavy = ('fsspec', 's3fs', 'gcsfs', 'aiobotocore', 'torch', 'vllm')\n"
        "before = [m for m in heavy if m in sys.modules]\n"
        "missing = [n for n in plancache.__all__ if getattr(plancache, n, None) is None]\n"
        "after = [m for m in heavy if m in sys.modules]\n"
        "print(before, missing, after)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                          capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[] [] []"
    assert (ROOT / "src" / "plancache" / "py.typed").exists()


def test_required_exports_are_public() -> None:
    import plancache

    for name in ("verify_plan", "load_trusted_keys", "open_store", "verify_location", "pull", "Resolver",
                 "TrustPolicy", "PlanReport", "PlanResult"):
        assert name in plancache.__all__
