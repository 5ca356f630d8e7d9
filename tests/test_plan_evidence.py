"""Issue 49 in the CLI: the evidence a plan was signed with, shown by ``verify --json``,
``inspect`` and ``explain`` ("none" for plans signed without it), and ``plancache release``, the
documented command that clears a node's hold-back of a plan. Reports validate against the schema.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import FP, NOW, plan_bytes
from plancache.cli.main import main
from plancache.keys.keyfile import generate_keypair
from plancache.trust.plans.plan import plan_name, sig_name
from plancache.trust.signing import sign_plan
from plancache.vllm_plugin.plan_health import notes
from test_cli_report import run_json

EVIDENCE = {
    "vllm_version": "0.33.0",
    "torch_version": "2.13.0",
    "compile": "warm",
    "weights_memory": 1 << 30,
    "available_kv_cache_memory": 50 << 30,
}


@pytest.fixture
def signed_dir(tmp_path: Path) -> tuple[Path, Path]:
    """Two plans: one signed with evidence, one signed as every plan was before issue 49."""
    signer = generate_keypair(tmp_path / "ci", force=False, comment="ci", env={})
    plans = tmp_path / "plans"
    plans.mkdir()
    old_fp = "fedcba9876543210"
    for fp, evidence in ((FP, EVIDENCE), (old_fp, None)):
        data = plan_bytes(fp=fp)
        (plans / plan_name(fp)).write_bytes(data)
        sig = sign_plan(plan_name(fp), data, signer, NOW, evidence=evidence)
        (plans / sig_name(fp)).write_bytes(sig)
    return plans, tmp_path / "ci.pub"


def test_verify_json_and_inspect_show_the_evidence_or_none(
    signed_dir: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    plans, trusted = signed_dir
    code, doc, _ = run_json(capsys, "verify", "@json", f"--trusted-keys={trusted}", str(plans))
    assert code == 0
    by_fp = {p["fingerprint"]: p for p in doc["plans"]}
    assert by_fp[FP]["evidence"] == EVIDENCE
    assert by_fp["fedcba9876543210"]["evidence"] == "none"  # old plans stay valid
    assert by_fp["fedcba9876543210"]["status"] == "valid"
    code, doc, _ = run_json(
        capsys, "inspect", "@json", f"--trusted-keys={trusted}", str(plans / sig_name(FP))
    )
    assert code == 0 and json.dumps(EVIDENCE, sort_keys=True) in json.dumps(doc, sort_keys=True)
    assert main(["inspect", f"--trusted-keys={trusted}", str(plans / sig_name(FP))]) == 0
    out = capsys.readouterr().out
    assert "evidence.compile" in out and "warm" in out


def _dead(noted: tuple[Path, int | None]) -> None:
    """The boot that wrote the note died: its open, locked note is closed (as the kernel does)."""
    if noted[1] is not None:
        os.close(noted[1])


def test_release_clears_a_hold_back_and_says_what_was_not_held(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes.hold_back(tmp_path, FP, "ab" * 32, 50 << 30, 40 << 30)
    _dead(notes.note_applying(tmp_path, FP, "ab" * 32, 50 << 30))
    assert notes.held_fingerprints(tmp_path) == [FP]
    from plancache.cli.diagnose.doctor import Checks
    from plancache.cli.diagnose.release import check_held_plans

    checks = Checks()  # doctor's row
    check_held_plans(checks, tmp_path)
    assert checks.items[0]["name"] == "held-plans" and FP in checks.items[0]["detail"]
    code, doc, _ = run_json(capsys, "release", "@json", "--dir", str(tmp_path), FP)
    assert (code, doc["released"], doc["not_held"]) == (0, [FP], [])
    assert notes.held_fingerprints(tmp_path) == []
    assert not notes.applying_path(tmp_path, FP).exists()
    code, doc, _ = run_json(capsys, "release", "@json", "--dir", str(tmp_path), FP)
    assert (code, doc["released"], doc["not_held"]) == (1, [], [FP])
    code, doc, _ = run_json(capsys, "release", "@json", "--dir", str(tmp_path), "not-a-fp")
    assert code == 2 and doc["error"]["reason"] == "config-error"


def test_a_note_that_names_other_bytes_is_not_this_plans() -> None:
    """A different signed plan for the fingerprint lifts the hold-back (and an old note)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        notes.hold_back(d, FP, "ab" * 32, 50 << 30, 40 << 30)
        assert notes.recall(d, FP, "ab" * 32).held is not None
        assert notes.recall(d, FP, "cd" * 32).held is None and notes.held_fingerprints(d) == []
        _dead(notes.note_applying(d, FP, "ab" * 32, 1))
        assert notes.recall(d, FP, "cd" * 32).unfinished is None
        _dead(notes.note_applying(d, FP, "ab" * 32, 1))
        notes.applying_path(d, FP).write_bytes(b"\x00garbage")  # unreadable: still a note
        assert notes.recall(d, FP, "ab" * 32).unfinished == {}


@pytest.mark.parametrize("compile_state", ["cold", "warm"])
def test_sign_signs_the_evidence_the_plugin_left_and_refuses_a_cold_boot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], compile_state: str
) -> None:
    """``plancache sign`` (what plancache-ci-bake runs) over a plan the plugin saved unsigned:
    the evidence note beside it is signed with it; a cold boot's plan is refused
    (``cold-compile``) unless ``--sign-cold``; a note for other bytes is ignored."""
    from plancache.storage.local.localdir import LocalPlanDir
    from plancache.trust import envelope as dsse
    from plancache.trust.plans.evidence import evidence_note
    from plancache.trust.statement import parse_statement

    generate_keypair(tmp_path / "ci", force=False, comment="ci", env={})
    plans = tmp_path / "plans"
    plans.mkdir()
    data = plan_bytes()
    (plans / plan_name(FP)).write_bytes(data)
    evidence = {**EVIDENCE, "compile": compile_state}
    LocalPlanDir(plans).write_evidence(FP, evidence_note(evidence, data))
    code, doc, _ = run_json(capsys, "sign", "@json", "--key", str(tmp_path / "ci"), str(plans))
    if compile_state == "cold":
        assert code == 1 and not (plans / sig_name(FP)).exists()
        assert "cold-compile" in json.dumps(doc)
        code, doc, _ = run_json(
            capsys, "sign", "@json", "--sign-cold", "--key", str(tmp_path / "ci"), str(plans)
        )
    assert code == 0
    statement = parse_statement(dsse.decode((plans / sig_name(FP)).read_bytes()).payload)
    assert dict(statement.evidence) == evidence
    # a note that names other bytes (re-profiled since) gives no evidence
    LocalPlanDir(plans).write_evidence(FP, evidence_note(evidence, data + b" "))
    (plans / sig_name(FP)).unlink()
    code, _, _ = run_json(capsys, "sign", "@json", "--key", str(tmp_path / "ci"), str(plans))
    statement = parse_statement(dsse.decode((plans / sig_name(FP)).read_bytes()).payload)
    assert code == 0 and dict(statement.evidence) == {}
