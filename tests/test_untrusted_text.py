"""Untrusted strings reach people and parsers only through safe_text: tables keep one row per
plan, --json stays valid, the plugin's decision line cannot be forged, a lone surrogate hides
nothing. The hostile bytes are real sidecars on disk, read by the real commands."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from conftest import FP, make_signer, plan_bytes
from plancache.cli.main import main
from plancache.clock import Stopwatch
from plancache.pipeline.resolver import utcnow
from plancache.storage.local.localdir import LocalPlanDir
from plancache.trust import envelope as dsse
from plancache.trust.errors import Reason
from plancache.trust.keyring.keyformat import openssh_line
from plancache.trust.plans.gate import Decision
from plancache.trust.plans.plan import plan_name
from plancache.trust.signing import sign_plan
from plancache.vllm_plugin.boot import log_decision

OTHER = "fedcba9876543210"
FORGED_ROW = f"\n{OTHER}  ci  valid"
FORGED_LOG = '" decision=apply reason=applied kv_cache_memory_bytes=1\nplancache: decision=apply'


def hostile_sidecar(keyid: str, fp: str = FP) -> bytes:
    """A canonical envelope whose (unsigned) keyid is attacker text."""
    signer = make_signer()
    env = dsse.decode(sign_plan(plan_name(fp), plan_bytes(fp), signer, utcnow()))
    return dsse.encode(
        dsse.Envelope(
            env.payload_type, env.payload, (dsse.Signature(keyid, env.signatures[0].sig),)
        )
    )


@pytest.fixture
def hostile_dir(tmp_path: Path) -> tuple[Path, Path]:
    directory = LocalPlanDir(tmp_path / "plans")
    directory.write(FP, plan_bytes(FP), hostile_sidecar("SHA256:x" + FORGED_ROW + "\x1b[2J"))
    directory.write(OTHER, plan_bytes(OTHER), hostile_sidecar("SHA256:\ud800lone"))
    keys = tmp_path / "trusted"
    keys.write_text(openssh_line(make_signer().public, "ci") + "\n")
    return directory.path, keys


@pytest.mark.parametrize("command", ["verify", "ls"])
def test_tables_keep_one_row_per_plan(
    command: str, hostile_dir: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, keys = hostile_dir
    extra = [f"--trusted-keys={keys}"] if command == "verify" else []
    code = main([command, *extra, str(directory)])
    out, _err = capsys.readouterr()
    assert code == (1 if command == "verify" else 0)
    rows = out.splitlines()
    assert len(rows) == 3, rows  # header + one row per plan, whatever the keyids hold
    assert ("\x1b" not in out and "\\x1b" in out) or command == "verify"
    assert all(row.startswith(("PLAN", FP, OTHER)) for row in rows)
    out.encode("utf-8")  # a lone surrogate would raise here (and did, in print)


def test_json_stays_valid_and_keeps_every_plan(
    hostile_dir: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, _ = hostile_dir
    assert main(["ls", "--json", str(directory)]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert [p["fingerprint"] for p in plans] == [FP, OTHER]
    # the data, escaped by JSON
    assert plans[0]["signer_ids"] == ["SHA256:x" + FORGED_ROW + "\x1b[2J"]


def test_decision_line_cannot_be_forged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="vllm.plancache")
    log_decision(
        Decision(False, Reason.UNTRUSTED_KEY, f"signed by {FORGED_LOG}", None, FP),
        "store",
        FP,
        Stopwatch.started(),
    )
    [record] = caplog.records
    line = record.getMessage()
    assert "\n" not in line and line.startswith("plancache: decision=profile")
    assert line.count("decision=") == 1 and line.count('"') == 2  # detail="…" opens and closes once
    assert line.endswith('"') and "kv_cache_memory_bytes=" not in line
