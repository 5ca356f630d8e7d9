"""One JSON report: every command's ``--json`` output, success and failure, validates against
``report.schema.json``, and stdout holds exactly one document whatever happens."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from conftest import FP, plan_bytes
from plancache.cli.main import main
from plancache.storage.local.localdir import LocalPlanDir
from plancache.trust.plans.plan import plan_name, sig_name

FP2 = "fedcba9876543210"
SCHEMA = json.loads(resources.files("plancache.cli").joinpath("report.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    """Run with --json; assert stdout is exactly one document that validates; return it."""
    try:
        code = main(["--json" if a == "@json" else a for a in argv])
    except SystemExit as exc:  # argparse usage errors exit 2 after the report is printed
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    doc = json.loads(out)  # one document: json.loads rejects anything after it
    VALIDATOR.validate(doc)
    assert doc["ok"] is (code == 0), (code, doc)
    return code, doc, err


@pytest.fixture
def setup(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    assert main(["keygen", str(tmp_path / "ci")]) == 0
    local = LocalPlanDir(tmp_path / "plans")
    local.write(FP, plan_bytes(), None)
    local.write(FP2, plan_bytes(fp=FP2), None)
    capsys.readouterr()
    return {
        "key": str(tmp_path / "ci"),
        "pub": str(tmp_path / "ci.pub"),
        "dir": str(local.path),
        "url": (tmp_path / "bucket").as_uri(),
        "tmp": str(tmp_path),
    }


def test_every_command_validates(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, setup: dict[str, str]
) -> None:
    s = setup
    code, doc, _ = run_json(capsys, "keygen", "@json", f"{s['tmp']}/other")
    assert code == 0 and doc["command"] == "keygen" and doc["keyid"].startswith("SHA256:")
    code, doc, _ = run_json(
        capsys, "sign", "@json", "--key", s["key"], "--fact", "gpu_memory_utilization=0.9", s["dir"]
    )
    # device facts missing: warned
    assert code == 0 and doc["command"] == "sign" and doc["warnings"]
    code, doc, _ = run_json(capsys, "verify", "@json", "--trusted-keys", s["pub"], s["dir"])
    plan = doc["plans"][0]
    assert (
        code == 0
        and plan["signed_at"].endswith("Z")
        and plan["signed_by"][0]["keyid"].startswith("SHA256:")
    )
    assert plan["signed_by"][0]["name"] == plan["signers"][0]
    code, doc, _ = run_json(capsys, "ls", "@json", s["dir"])
    assert code == 0 and doc["plans"][0]["status"] == "unverified"
    code, doc, _ = run_json(capsys, "inspect", "@json", f"{s['dir']}/{sig_name(FP)}")
    assert code == 0 and doc["statement"]["signed_at"].endswith("Z")
    code, doc, _ = run_json(capsys, "push", "@json", "--dry-run", s["dir"], s["url"])
    assert code == 0 and doc["dry_run"] and doc["uploaded"] == 2 and not Path(s["url"][7:]).exists()
    code, doc, _ = run_json(capsys, "push", "@json", s["dir"], s["url"])
    assert code == 0 and doc["objects_uploaded"] == 4
    code, doc, _ = run_json(
        capsys, "pull", "@json", "--trusted-keys", s["pub"], s["url"], f"{s['tmp']}/node"
    )
    assert code == 0 and {p["action"] for p in doc["plans"]} == {"written"}
    code, doc, _ = run_json(capsys, "prune", "@json", "--older-than", "1d", s["url"])
    assert code == 0 and doc["deleted"] == [] and doc["kept"] == 2
    monkeypatch.setenv("VLLM_CACHE_ROOT", f"{s['tmp']}/vllm")
    code, doc, _ = run_json(capsys, "doctor", "@json")
    assert doc["command"] == "doctor" and {c["name"] for c in doc["checks"]} >= {
        "entry-point",
        "local-plans",
    }
    # the invalid case: ok false without a whole-command error
    (Path(s["dir"]) / plan_name(FP)).write_bytes(plan_bytes(kv=1))
    code, doc, _ = run_json(capsys, "verify", "@json", "--trusted-keys", s["pub"], s["dir"])
    assert code == 1 and "error" not in doc and doc["plans"][0]["reason"] == "digest-mismatch"


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["verify", "@json", "--threshold", "0", "."], "usage-error"),
        (["prune", "@json", "file:///tmp"], "usage-error"),
        (["verify", "@json", "/nonexistent/plans"], "config-error"),
        (["verify", "@json", "--trusted-keys", "{pub}", "/nonexistent/plans"], "config-error"),
        (["ls", "@json", "{dir}/" + plan_name(FP)], "config-error"),
        (["pull", "@json", "--trusted-keys", "{pub}", "not-a-url"], "config-error"),
        (["push", "@json", "--fingerprint", "XYZ", "{dir}", "file:///tmp/x"], "config-error"),
        (["ls", "@json", "--storage-option", "bogus=1", "file:///tmp"], "config-error"),
        (["verify", "@json", "--trusted-keys", "{pub}", "{tmp}/empty"], "no-plans"),
        (["sign", "@json", "{dir}"], "config-error"),
        (["keygen", "@json", "{key}"], "config-error"),
        (["inspect", "@json", "/tmp/not-a-plan.json"], "config-error"),
    ],
)
def test_failures_print_one_report(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    setup: dict[str, str],
    argv: list[str],
    reason: str,
) -> None:
    monkeypatch.delenv("PLANCACHE_TRUSTED_KEYS", raising=False)
    monkeypatch.delenv("PLANCACHE_SIGNING_KEY", raising=False)
    Path(setup["tmp"], "empty").mkdir()
    code, doc, err = run_json(capsys, *[a.format(**setup) for a in argv])
    assert code == (1 if reason == "no-plans" else 2)
    assert doc["error"]["reason"] == reason and doc["error"]["detail"]
    assert doc["command"] == argv[0] and "Traceback" not in err


def test_schema_names_every_builtin_command() -> None:
    from plancache.cli.parser import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    documented = {
        rule["if"]["properties"]["command"]["const"]
        for rule in SCHEMA["allOf"]
        if "command" in rule.get("if", {}).get("properties", {})
    }
    # demo tells a story and completion prints shell code: neither has --json
    assert set(sub.choices) - {"demo", "completion"} == documented


def test_pubkey_json_validates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keygen", str(tmp_path / "k")]) == 0
    capsys.readouterr()
    assert main(["pubkey", "--json", "--name", "ci", str(tmp_path / "k")]) == 0
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    assert (
        doc["public_key_line"] == (tmp_path / "k.pub").read_text().strip().rsplit(" ", 1)[0] + " ci"
    )


def test_compile_cache_json_validates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "vllm-cache"
    (root / "torch_compile_cache" / "torch_aot_compile").mkdir(parents=True)
    assert main(["compile-cache", "ls", "--json", str(root)]) == 0
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    assert (doc["command"], doc["ok"], doc["caches"]) == ("compile-cache", True, [])
