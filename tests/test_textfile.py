"""The fleet view: boot records as a node_exporter textfile, parsed back by Prometheus's own parser (issue 20)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from plancache.cli.main import main
from plancache.cli.diagnose.textfile import render
from plancache.storage.local import records

APPLIED = {"schema": "plancache.boot/v1", "time": "2026-12-02T05:00:00Z", "rank": 0, "final": True,
           "plan": {"decision": "apply", "reason": "applied", "source": "store"},
           "compile_cache": [{"cache": "torch_aot_compile/" + "b" * 64, "decision": "load", "reason": "verified",
                              "used": False}],
           "plugin_ms": 1234.5, "saved_ms": {"profiling": 41000.0, "compile": None}, "warnings": ["x"]}
MISSED = {**APPLIED, "rank": 1, "plan": {"decision": "profile", "reason": 'no-plan"\\\n'}, "compile_cache": [],
          "saved_ms": {"profiling": None, "compile": None}}


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_newest_record_of_each_rank_becomes_gauges_prometheus_parses() -> None:
    older = {**APPLIED, "time": "2026-12-01T00:00:00Z", "plan": {"decision": "profile", "reason": "no-plan"}}
    samples = _samples(render([APPLIED, MISSED, older]))  # newest first, as doctor reads them
    r0, r1 = (("rank", "0"),), (("rank", "1"),)
    assert samples[("plancache_boot_plan_applied", r0)] == 1 and samples[("plancache_boot_plan_applied", r1)] == 0
    assert samples[("plancache_boot_compile_cache_unused", r0)] == 1
    assert samples[("plancache_boot_compile_cache_loaded", r0)] == 0
    assert samples[("plancache_boot_saved_seconds", (("kind", "profiling"), ("rank", "0")))] == 41.0
    assert samples[("plancache_boot_plugin_seconds", r0)] == pytest.approx(1.2345, abs=1e-3)
    assert samples[("plancache_boot_timestamp_seconds", r0)] == 1796187600
    decision = [k for k in samples if k[0] == "plancache_boot_decision" and ("rank", "1") in k[1]]
    assert dict(decision[0][1])["plan_reason"] == 'no-plan"\\\n'  # escaped, parsed back intact


def test_doctor_writes_the_textfile_from_the_records_under_the_cache_root(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    records.write(tmp_path / "cache", "20261202T050000Z-7-r0-0000abcd.json", json.dumps(APPLIED).encode())
    out = tmp_path / "textfile" / "plancache.prom"
    out.parent.mkdir()
    main(["doctor", "--json", "--textfile", str(out)])
    doc = json.loads(capsys.readouterr().out)
    (check,) = [c for c in doc["checks"] if c["name"] == "boot-records"]
    assert check["status"] == "warn" and check["detail"].endswith("x")  # the last record's warning, said
    assert _samples(out.read_text())[("plancache_boot_plan_applied", (("rank", "0"),))] == 1
    assert [p.name for p in out.parent.iterdir()] == ["plancache.prom"]  # atomic: no temporary left
