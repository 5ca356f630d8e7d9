"""The public Python API: the example in docs/python-api.md runs as written, and the root stays
light."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FP, make_signer, plan_bytes
from plancache.pipeline.resolver import utcnow
from plancache.storage.local.localdir import LocalPlanDir
from plancache.trust.keyring.keyformat import openssh_line
from plancache.trust.plans.plan import Plan, plan_name, render_plan
from plancache.trust.signing import sign_plan
from store_servers import (
    MotoServer,
    moto_server,  # noqa: F401 - a fixture, named as a parameter
)

ROOT = Path(__file__).resolve().parents[1]
TAMPERED = "fedcba9876543210"


def readme_example() -> str:
    """The first python block of the Python API page (the README's section, moved to docs/)."""
    text = (ROOT / "docs" / "python-api.md").read_text()
    section = text.split("# Python API", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "docs/python-api.md has no python example"
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
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "PLANCACHE_URL": store.path.as_uri(),
        "VLLM_CACHE_ROOT": str(tmp_path / "cache"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", readme_example()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
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
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.strip() == "[] [] []"
    assert (ROOT / "src" / "plancache" / "py.typed").exists()


def test_required_exports_are_public() -> None:
    import plancache

    for name in (
        "verify_plan",
        "load_trusted_keys",
        "open_store",
        "verify_location",
        "pull",
        "Resolver",
        "TrustPolicy",
        "PlanReport",
        "PlanResult",
    ):
        assert name in plancache.__all__


def test_the_api_reads_the_environment_as_the_cli_does_explicit_arguments_winning(
    tmp_path: Path,
    moto_server: MotoServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import json

    import pytest

    import plancache
    from plancache.storage.store import open_store
    from store_servers import AWS_ENV

    signer = make_signer()
    (tmp_path / "trusted-keys").write_text(openssh_line(signer.public, "ci") + "\n")
    url = f"s3://{moto_server.new_bucket()}/plans"
    data = plan_bytes(FP)
    open_store(url, moto_server.options, 30).put(
        FP, data, sign_plan(plan_name(FP), data, signer, utcnow())
    )
    for key, value in AWS_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(tmp_path / "trusted-keys"))
    monkeypatch.setenv(
        "PLANCACHE_STORAGE_OPTIONS", json.dumps({"endpoint_url": moto_server.endpoint})
    )
    # no trust, no storage options given: both come from the environment, as for `plancache verify`
    (report,) = plancache.verify_location(url)
    assert report.status == "valid" and report.signer_ids == [signer.keyid]
    (result,) = plancache.pull(url, tmp_path / "node", fingerprints=[FP])
    assert result.verified is not None and (tmp_path / "node" / plan_name(FP)).read_bytes() == data
    # an explicit option wins over the environment's, key by key
    monkeypatch.setenv("PLANCACHE_STORAGE_OPTIONS", "endpoint_url=http://127.0.0.1:1")
    (report,) = plancache.verify_location(
        url, storage_options={"endpoint_url": moto_server.endpoint}
    )
    assert report.status == "valid"
    monkeypatch.delenv("PLANCACHE_TRUSTED_KEYS")
    with pytest.raises(plancache.ConfigError, match="PLANCACHE_TRUSTED_KEYS"):
        plancache.verify_location(url)


def test_pull_counts_the_store_opening_inside_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One budget from the call, as in the CLI: a store that takes most of the budget to open
    (credential discovery, an SDK import) leaves the fetches only what is left, never a fresh
    budget of their own (which made a pull take up to twice its timeout)."""
    import time

    import plancache.api as api
    from plancache.clock import Deadline
    from plancache.trust.keyring.keys import Keyring

    opened: dict[str, Deadline] = {}
    seen: list[Deadline] = []

    def slow_open(url: str, options: object, budget: float, deadline: Deadline) -> object:
        opened["deadline"] = deadline
        time.sleep(0.3)
        return object()

    class Recorder:
        def __init__(self, directory: object, policy: object, store: object) -> None:
            pass

        def pull(self, fingerprints: object, deadline: Deadline) -> list[object]:
            seen.append(deadline)
            return []

    monkeypatch.setattr(api, "open_url", slow_open)
    monkeypatch.setattr(api, "Resolver", Recorder)
    started = time.monotonic()
    assert api.pull("s3://b/plans", tmp_path, Keyring(), timeout=2.0) == []
    assert seen == [opened["deadline"]] and started <= seen[0].start <= started + 0.05
    assert seen[0].budget == 2.0


def test_the_type_stub_names_each_export_where_it_lives() -> None:
    """``__init__.pyi`` is what type checkers read instead of the lazy ``__init__.py``: each name
    it imports must be importable from the module it names, and it must name every export (a
    module moved into a subfolder once left the stub pointing at the old path)."""
    import ast
    import importlib

    import plancache

    stub = ast.parse((ROOT / "src" / "plancache" / "__init__.pyi").read_text(encoding="utf-8"))
    named: dict[str, str] = {}
    for node in stub.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            for alias in node.names:
                named[alias.asname or alias.name] = f"plancache.{node.module}"
    for name, module in named.items():
        assert hasattr(importlib.import_module(module), name), (name, module)
    assert set(plancache.__all__) <= set(named), set(plancache.__all__) - set(named)
