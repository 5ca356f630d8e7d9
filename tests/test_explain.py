"""``plancache explain`` on vLLM 0.33's real configuration code (CPU, pinned device facts; issue
20).

The store holds plans signed the way the plugin signs them (with the fingerprint's inputs in the
clear) but made under one differing factor; explain must name exactly that factor. Only verified
statements count: the same inputs in an unsigned or untrusted sidecar are not evidence. Compile
caches: a signed manifest carrying vLLM's ``cache_key_factors.json`` with one differing
environment variable is explained by that variable. This module imports vLLM's config code but not
``gpu_worker`` (tests/test_vllm_plugin.py checks the import order of its own).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest

from plancache.keys.keyfile import generate_keypair
from plancache.pipeline.compile_cache import flows as cc
from plancache.pipeline.compile_cache.local_caches import CacheRoot
from plancache.trust import envelope as dsse
from plancache.trust.inputs import fingerprint_of_inputs
from plancache.trust.plans.plan import Plan, plan_name, render_plan, sig_name
from plancache.trust.signing import sign_plan
from plancache.trust.statement import parse_statement
from vllm_cpu import DEVICE_NAME, DEVICE_TOTAL, GIB, conditions, cpu_environ, write_tiny_model

PINS = ["--device-name", DEVICE_NAME, "--device-total-memory", str(DEVICE_TOTAL)]
TINY = [
    "--max-model-len",
    "128",
    "--enforce-eager",
    "--load-format",
    "dummy",
    "--gpu-memory-utilization",
    "0.9",
]
SCHEMA = json.loads(resources.files("plancache.cli").joinpath("report.schema.json").read_text())


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """vLLM imported for the CPU platform, a tiny model, and this node's fingerprint and inputs."""
    root = tmp_path_factory.mktemp("explain")
    cpu = cpu_environ(root / "cache")
    saved = {k: os.environ.get(k) for k in cpu}
    os.environ.update(cpu)
    model = root / "tiny-llama"
    write_tiny_model(model)
    from plancache.cli.diagnose.fingerprint import node_config
    from plancache.vllm_plugin.adapter import compile_factors

    result, cfg = node_config([str(model), *TINY], DEVICE_NAME, DEVICE_TOTAL)
    yield SimpleNamespace(model=model, rank0=result["ranks"][0], here=compile_factors(cfg))
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def keys(tmp_path: Path) -> SimpleNamespace:
    ci = generate_keypair(tmp_path / "ci", force=False, comment="ci", env={})
    other = generate_keypair(tmp_path / "other", force=False, comment="other", env={})
    return SimpleNamespace(signer=ci, other=other, trusted=tmp_path / "ci.pub")


def _plan(
    directory: Path, inputs: dict[str, Any] | None, signer: Any, fp: str | None = None
) -> str:
    """A plan as the plugin saves it: signed with the gate's conditions and, when given, the
    inputs."""
    fp = fp or fingerprint_of_inputs(inputs or {})
    directory.mkdir(parents=True, exist_ok=True)
    data = render_plan(Plan(fp, 50 * GIB, 60 * GIB))
    (directory / plan_name(fp)).write_bytes(data)
    if signer is not None:
        sig = sign_plan(
            plan_name(fp),
            data,
            signer,
            datetime.now(timezone.utc),
            provenance=conditions(),
            inputs=inputs,
            measurements={"profile_ms": 4200.0},
        )
        (directory / sig_name(fp)).write_bytes(sig)
    return fp


def _explain(
    capsys: pytest.CaptureFixture[str],
    node: SimpleNamespace,
    location: Path | str,
    *extra: str,
    serve: list[str] = TINY,
) -> tuple[int, dict[str, Any]]:
    """``explain --json`` of ``location`` for the tiny model served with ``serve``: the exit code
    and the report, checked against its schema."""
    from plancache.cli.main import main

    code = main(["explain", "--json", *PINS, *extra, str(location), "--", str(node.model), *serve])
    out = capsys.readouterr().out
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    return code, doc


def _fingerprint_report(
    capsys: pytest.CaptureFixture[str], node: SimpleNamespace, report: Path, serve: list[str]
) -> str:
    """``fingerprint --json > report`` for the tiny model served with ``serve``, as CI saves it
    for ``sign --inputs``; rank 0's fingerprint."""
    from plancache.cli.main import main

    assert main(["fingerprint", "--json", *PINS, "--", str(node.model), *serve]) == 0
    report.write_text(capsys.readouterr().out)
    return str(json.loads(report.read_text())["ranks"][0]["fingerprint"])


def _sign_inputs(tmp_path: Path, report: Path, plans: Path, *extra: str) -> int:
    """``sign --key ci --inputs report [extra] plans``: the exit code."""
    from plancache.cli.main import main

    return main(
        ["sign", "--key", str(tmp_path / "ci"), "--inputs", str(report), *extra, str(plans)]
    )


def test_a_plan_made_on_another_vllm_is_explained_by_that_one_input(
    node: SimpleNamespace, keys: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    other_vllm = {**node.rank0["factors"], "vllm": "0.33.1"}
    other_device = {
        **node.rank0["factors"],
        "device_name": "NVIDIA A100-SXM4-80GB",
        "vllm": "0.32.0",
    }
    near = _plan(store, other_vllm, keys.signer)
    _plan(store, other_device, keys.signer)
    code, doc = _explain(capsys, node, store, "--trusted-keys", str(keys.trusted))
    assert (
        code == 1
        and doc["ok"] is False
        and doc["compile_cache" if False else "ranks"][0]["compile_cache"] is None
    )
    plan = doc["ranks"][0]["plan"]
    assert (plan["decision"], plan["reason"]) == ("profile", "no-plan")
    first, second = plan["candidates"]
    assert first["fingerprint"] == near and first["signers"] == ["ci"]
    assert first["differs"] == [{"input": "vllm", "signed": "0.33.1", "here": "0.33.0"}]
    assert {d["input"] for d in second["differs"]} == {"vllm", "device_name"}
    # the table says the same in words
    from plancache.cli.main import main

    assert (
        main(
            [
                "explain",
                *PINS,
                "--trusted-keys",
                str(keys.trusted),
                str(store),
                "--",
                str(node.model),
                *TINY,
            ]
        )
        == 1
    )
    out = capsys.readouterr().out
    assert f"nearest plan {near}" in out and "vllm: signed 0.33.1, here 0.33.0" in out


def test_the_nodes_own_plan_would_apply_and_a_changed_condition_is_named(
    node: SimpleNamespace, keys: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    fp = _plan(store, dict(node.rank0["factors"]), keys.signer)
    assert fp == node.rank0["fingerprint"]  # the plugin's inputs reproduce vLLM's key
    code, doc = _explain(capsys, node, store, "--trusted-keys", str(keys.trusted))
    assert code == 0 and doc["ranks"][0]["plan"]["decision"] == "apply"
    # gpu_memory_utilization is no fingerprint input: the gate's condition
    _, doc = _explain(
        capsys, node, store, "--trusted-keys", str(keys.trusted), serve=[*TINY[:-1], "0.85"]
    )
    plan = doc["ranks"][0]["plan"]
    assert plan["fingerprint"] == fp  # vLLM 0.33's cache config hash ignores the utilization
    assert (plan["decision"], plan["reason"]) == ("profile", "condition-mismatch")
    assert plan["differs"] == [{"input": "gpu_memory_utilization", "signed": 0.9, "here": 0.85}]


def test_only_verified_statements_are_compared(
    node: SimpleNamespace, keys: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same inputs in an unsigned plan, or one signed by an untrusted key, are no evidence; a
    plan signed the old way (no inputs) still verifies and is counted as not comparable."""
    store = tmp_path / "store"
    claim = {**node.rank0["factors"], "vllm": "0.33.1"}
    _plan(store, claim, None)  # unsigned
    untrusted = {**node.rank0["factors"], "torch": "9.9"}
    _plan(store, untrusted, keys.other)
    old = _plan(store, None, keys.signer, fp="00000000000000aa")
    statement = parse_statement(dsse.decode((store / sig_name(old)).read_bytes()).payload)
    assert (
        not statement.inputs and "inputs" not in json.loads(statement.to_json_bytes())["predicate"]
    )
    code, doc = _explain(capsys, node, store, "--trusted-keys", str(keys.trusted))
    plan = doc["ranks"][0]["plan"]
    assert code == 1 and plan["candidates"] == []
    assert plan["not_compared"] == {"unverified": 2, "without_inputs": 1}


def test_a_compile_cache_missed_by_one_environment_variable_is_explained_by_it(
    node: SimpleNamespace, keys: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Dynamo #10695's shape: a per-pod variable hashed into the key. The manifest signs vLLM's
    cache_key_factors.json (found in the <10 hex> directory it writes); one variable differs."""
    root = tmp_path / "vllm-cache"
    plans = root / "startup_plan"
    _plan(plans, dict(node.rank0["factors"]), keys.signer)
    factors = json.loads(json.dumps(node.here))
    factors["env"]["VLLM_PP_LAYER_PARTITION"] = "pod-7"
    factors.update(code_hash="c" * 64, compiler_hash="d" * 64)
    subject = "0123456789"
    inside = root / "torch_compile_cache" / subject / "rank_0_0" / "backbone"
    inside.mkdir(parents=True)
    (inside / "cache_key_factors.json").write_text(json.dumps(factors))
    (inside / "vllm_compile_cache.py").write_text("{}")
    signed = cc.sign_cache(CacheRoot(root), subject, keys.signer, datetime.now(timezone.utc))
    assert (
        signed.key_factors is not None
        and signed.key_factors["env"]["VLLM_PP_LAYER_PARTITION"] == "pod-7"
    )
    code, doc = _explain(capsys, node, plans, "--trusted-keys", str(keys.trusted))
    cache = doc["ranks"][0]["compile_cache"]
    assert doc["compile_location"] == str(root) and doc["ranks"][0]["plan"]["decision"] == "apply"
    assert code == 1 and (cache["decision"], cache["reason"]) == ("compile", "no-cache")
    here = node.here["env"].get("VLLM_PP_LAYER_PARTITION")
    assert cache["candidates"][0]["differs"] == [
        {"input": "env.VLLM_PP_LAYER_PARTITION", "signed": "pod-7", "here": here}
    ]
    # the same factors as here: would load
    factors["env"]["VLLM_PP_LAYER_PARTITION"] = here
    (inside / "cache_key_factors.json").write_text(json.dumps(factors))
    (root / "torch_compile_cache" / f"{subject}.plancache.sig").unlink()
    cc.sign_cache(CacheRoot(root), subject, keys.signer, datetime.now(timezone.utc))
    code, doc = _explain(capsys, node, plans, "--trusted-keys", str(keys.trusted))
    assert code == 0 and doc["ranks"][0]["compile_cache"]["decision"] == "load"


def test_explain_without_trusted_keys_is_one_line(
    node: SimpleNamespace,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from plancache.cli.main import main

    monkeypatch.delenv("PLANCACHE_TRUSTED_KEYS", raising=False)
    (tmp_path / "plans").mkdir()
    assert main(["explain", str(tmp_path / "plans"), "--", str(node.model), *TINY]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "no trusted keys" in err


def test_sign_inputs_records_what_plancache_fingerprint_printed(
    node: SimpleNamespace, keys: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CI without the plugin: ``fingerprint --json > fp.json``, then ``sign --inputs fp.json``."""
    report = tmp_path / "fp.json"
    _fingerprint_report(capsys, node, report, TINY)
    plans = tmp_path / "plans"
    fp = _plan(plans, None, None, fp=node.rank0["fingerprint"])
    # not in the file: signed without inputs
    other = _plan(plans, None, None, fp="00000000000000bb")
    assert _sign_inputs(tmp_path, report, plans, "--fact", "gpu_memory_utilization=0.9") == 0
    capsys.readouterr()
    for name, expected in ((fp, node.rank0["factors"]), (other, {})):
        statement = parse_statement(dsse.decode((plans / sig_name(name)).read_bytes()).payload)
        assert dict(statement.inputs) == expected
    bad = json.loads(report.read_text())
    bad["ranks"][0]["factors"]["vllm"] = "0.0.0"
    report.write_text(json.dumps(bad))
    assert _sign_inputs(tmp_path, report, plans, "--replace") == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "do not hash to its fingerprint" in err


def test_a_differing_vllm_config_is_narrowed_to_the_part_that_differs(
    node: SimpleNamespace, keys: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plan baked for --max-model-len 64 on a node that serves 128: the one input that differs is
    vLLM's config hash, and the signed configuration parts say which part of it."""
    report = tmp_path / "fp.json"
    baked = _fingerprint_report(capsys, node, report, [*TINY[:1], "64", *TINY[2:]])
    store = tmp_path / "store"
    _plan(store, None, None, fp=baked)
    assert _sign_inputs(tmp_path, report, store, "--fact", "gpu_memory_utilization=0.9") == 0
    capsys.readouterr()
    code, doc = _explain(capsys, node, store, "--trusted-keys", str(keys.trusted))
    (candidate,) = doc["ranks"][0]["plan"]["candidates"]
    names = [d["input"] for d in candidate["differs"]]
    assert code == 1 and candidate["fingerprint"] == baked
    assert names[0] == "vllm_config" and "vllm_config.model_config" in names
    assert all(n == "vllm_config" or n.startswith("vllm_config.") for n in names)


def test_a_store_url_is_explained_with_its_plans_and_compile_caches(
    node: SimpleNamespace, keys: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same comparisons against a store (file://): plans fetched and verified as ``verify``
    does, compile caches by their signature objects."""
    from plancache.keys.keyfile import load_keyring
    from plancache.storage.store import open_store

    bucket = tmp_path / "bucket"
    _plan(bucket, dict(node.rank0["factors"]), keys.signer)
    root = CacheRoot(tmp_path / "build")
    subject = "0123456789"
    inside = root.directory(subject) / "rank_0_0" / "backbone"
    inside.mkdir(parents=True)
    (inside / "cache_key_factors.json").write_text(json.dumps({**node.here, "code_hash": "c" * 64}))
    (inside / "vllm_compile_cache.py").write_text("{}")
    now = datetime.now(timezone.utc)
    cc.sign_cache(root, subject, keys.signer, now)
    store = open_store(bucket.as_uri(), {}, timeout=10)
    assert cc.push_cache(store, root, subject, load_keyring(keys.trusted), now).action == "pushed"
    code, doc = _explain(capsys, node, bucket.as_uri(), "--trusted-keys", str(keys.trusted))
    entry = doc["ranks"][0]
    assert code == 0 and doc["compile_location"] == bucket.as_uri()
    assert entry["plan"]["decision"] == "apply" and entry["compile_cache"]["cache"] == subject
