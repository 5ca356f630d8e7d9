"""The fleet view: boot records as a node_exporter textfile, parsed back by Prometheus's own parser
(issue 20)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from plancache.cli.diagnose.textfile import render
from plancache.cli.main import main
from plancache.storage.local import records

APPLIED = {
    "schema": "plancache.boot/v1",
    "time": "2026-12-02T05:00:00Z",
    "rank": 0,
    "final": True,
    "plan": {"decision": "apply", "reason": "applied", "source": "store"},
    "compile_cache": [
        {
            "cache": "torch_aot_compile/" + "b" * 64,
            "decision": "load",
            "reason": "verified",
            "used": False,
        }
    ],
    "plugin_ms": 1234.5,
    "saved_ms": {"profiling": 41000.0, "compile": None},
    "warnings": ["x"],
}
MISSED = {
    **APPLIED,
    "rank": 1,
    "plan": {"decision": "profile", "reason": 'no-plan"\\\n'},
    "compile_cache": [],
    "saved_ms": {"profiling": None, "compile": None},
}


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_newest_record_of_each_rank_becomes_gauges_prometheus_parses() -> None:
    older = {
        **APPLIED,
        "time": "2026-12-01T00:00:00Z",
        "plan": {"decision": "profile", "reason": "no-plan"},
    }
    samples = _samples(render([APPLIED, MISSED, older]))  # newest first, as doctor reads them
    r0, r1 = (("rank", "0"),), (("rank", "1"),)
    assert (
        samples[("plancache_boot_plan_applied", r0)] == 1
        and samples[("plancache_boot_plan_applied", r1)] == 0
    )
    assert samples[("plancache_boot_compile_cache_unused", r0)] == 1
    assert samples[("plancache_boot_compile_cache_loaded", r0)] == 0
    assert samples[("plancache_boot_saved_seconds", (("kind", "profiling"), ("rank", "0")))] == 41.0
    assert samples[("plancache_boot_plugin_seconds", r0)] == pytest.approx(1.2345, abs=1e-3)
    assert samples[("plancache_boot_timestamp_seconds", r0)] == 1796187600
    decision = [k for k in samples if k[0] == "plancache_boot_decision" and ("rank", "1") in k[1]]
    # not a documented reason: never the record's string
    assert dict(decision[0][1])["plan_reason"] == "other"


def test_doctor_writes_the_textfile_from_the_records_under_the_cache_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    records.write(
        tmp_path / "cache", "20261202T050000Z-7-r0-0000abcd.json", json.dumps(APPLIED).encode()
    )
    out = tmp_path / "textfile" / "plancache.prom"
    out.parent.mkdir()
    main(["doctor", "--json", "--textfile", str(out)])
    doc = json.loads(capsys.readouterr().out)
    (check,) = [c for c in doc["checks"] if c["name"] == "boot-records"]
    # the last record's warning, said
    assert check["status"] == "warn" and check["detail"].endswith("x")
    assert _samples(out.read_text())[("plancache_boot_plan_applied", (("rank", "0"),))] == 1
    assert [p.name for p in out.parent.iterdir()] == ["plancache.prom"]  # atomic: no temporary left


def _record(root: Path, second: int, rank: int, doc: object | bytes) -> str:
    """A record file as the plugin names it (time order = name order), bytes as given."""
    name = (
        f"20261202T05{second // 60:02d}{second % 60:02d}Z-{100 + second}-r{rank}-{second:08x}.json"
    )
    records.write(root, name, doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    return name


def _doctor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> tuple[int, Path]:
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    out = tmp_path / "textfile" / "plancache.prom"
    out.parent.mkdir(exist_ok=True)
    return main(["doctor", *extra, "--textfile", str(out)]), out


def test_every_rank_of_an_8_gpu_node_is_exported_whatever_records_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "cache"
    # two boots of 8 ranks: the second applied
    for boot, decision in enumerate(("profile", "apply")):
        for rank in range(8):
            _record(
                root,
                boot * 10 + rank,
                rank,
                {**APPLIED, "rank": rank, "plan": {"decision": decision, "reason": "applied"}},
            )
    code, out = _doctor(tmp_path, monkeypatch, "--json")  # --records 5 by default
    assert code in (0, 1)
    (check,) = [
        c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "boot-records"
    ]
    assert len(check["data"]["records"]) == 5  # the human view keeps --records
    samples = _samples(out.read_text())
    assert {dict(k[1])["rank"] for k in samples if k[0] == "plancache_boot_plan_applied"} == {
        str(r) for r in range(8)
    }
    # the newest each
    assert all(samples[("plancache_boot_plan_applied", (("rank", str(r)),))] == 1 for r in range(8))


BAD = {
    "a number for a list": {**APPLIED, "rank": 1, "compile_cache": 5},
    "a number for the warnings": {**APPLIED, "rank": 2, "warnings": 7},
    "a rank that is a string": {**APPLIED, "rank": "3"},
    "a rank that is a bool": {**APPLIED, "rank": True},
    "a list for the plan": {**APPLIED, "rank": 4, "plan": ["apply"]},
    "a number in the warnings": {**APPLIED, "rank": 5, "warnings": [1]},
    "a dict for a decision": {**APPLIED, "rank": 6, "plan": {"decision": {"x": 1}}},
    "an infinite number": b'{"rank": 7, "plugin_ms": 1e400}',
    "a lone surrogate": b'{"rank": 8, "plan": {"decision": "apply", "reason": "\\ud800"}}',
    "a lone surrogate in a key": b'{"rank": 9, "saved_ms": {"\\udfff": 1}}',
    "deep nesting": ('{"rank": 10, "extra": ' + "[" * 200 + "]" * 200 + "}").encode(),
    "nesting past the parser": (
        '{"rank": 11, "extra": ' + "[" * 30000 + "]" * 30000 + "}"
    ).encode(),
    "a huge record": json.dumps({**APPLIED, "rank": 12, "pad": "x" * 70000}).encode(),
    "not JSON": b"\xff\xfe{",
    "not an object": b"[1, 2]",
    "a huge integer": b'{"rank": 13, "plugin_ms": ' + b"9" * 5000 + b"}",
}


@pytest.mark.parametrize("textfile", [True, False])
def test_malformed_records_are_skipped_with_a_warning_and_the_textfile_still_rewritten(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    textfile: bool,
) -> None:
    root = tmp_path / "cache"
    _record(root, 0, 0, APPLIED)
    names = [_record(root, 1 + i, 1, doc) for i, doc in enumerate(BAD.values())]
    newest_bad_rank0 = _record(root, 59, 0, {**APPLIED, "compile_cache": {"not": "a list"}})
    if textfile:
        code, out = _doctor(tmp_path, monkeypatch, "--records", "50")
        out.write_text("stale\n")
        capsys.readouterr()
        code, out = _doctor(tmp_path, monkeypatch, "--records", "50")
    else:  # the human table, without a textfile, takes the same records
        monkeypatch.setenv("VLLM_CACHE_ROOT", str(root))
        code = main(["doctor", "--records", "50"])
    assert code in (0, 1)  # never an internal error (exit 2 or more)
    captured = capsys.readouterr()
    skipped = [line for line in captured.err.splitlines() if "boot record skipped" in line]
    assert len(skipped) == len(BAD) + 1 and all(
        n in captured.err for n in [*names, newest_bad_rank0]
    )
    assert "WARN" in captured.out and "\ud800" not in captured.out
    if textfile:
        # rewritten, from the one good record (rank 0's older one)
        samples = _samples(out.read_text())
        assert samples[("plancache_boot_plan_applied", (("rank", "0"),))] == 1
        assert {dict(k[1])["rank"] for k in samples if k[0] == "plancache_boot_plan_applied"} == {
            "0"
        }
        assert sorted(p.name for p in out.parent.iterdir()) == ["plancache.prom"]


def test_labels_are_decisions_and_reason_codes_of_the_documented_set() -> None:
    from plancache.cli.diagnose import textfile

    odd = {
        **APPLIED,
        "plan": {"decision": "apply\n", "reason": "x" * 120},
        "compile_cache": [
            {"decision": "load", "reason": "store-rejected"},
            {"decision": 'a"b', "reason": "z"},
        ],
    }
    plain = {
        **APPLIED,
        "rank": 1,
        "plan": None,
        "compile_cache": [{"decision": "quarantined", "reason": "expired"}],
    }
    decision = {
        dict(k[1])["rank"]: dict(k[1])
        for k in _samples(render([odd, plain]))
        if k[0] == "plancache_boot_decision"
    }
    assert decision["0"] == {
        "rank": "0",
        "plan_decision": "other",
        "plan_reason": "other",
        "compile_decision": "load",
        "compile_reason": "store-rejected",
    }
    assert decision["1"] == {
        "rank": "1",
        "plan_decision": "",
        "plan_reason": "",
        "compile_decision": "quarantined",
        "compile_reason": "expired",
    }
    docs = Path(__file__).resolve().parents[1] / "docs"
    table = [
        line.split("|")
        for line in (docs / "compile-cache.md").read_text().splitlines()
        if line.startswith("| `") and "` |" in line
    ]
    import re

    for row in table:  # every decision and reason the compile-cache table names is a label value
        decisions, reasons = re.findall(r"`([a-z-]+)`", row[1]), re.findall(r"`([a-z-]+)`", row[2])
        assert (
            set(decisions) <= textfile.COMPILE_DECISIONS
            and set(reasons) <= textfile.COMPILE_REASONS
        ), row
    section = (docs / "commands.md").read_text().split("## Rejection reasons")[1].split("\n## ")[0]
    documented = set(re.findall(r"`([a-z][a-z-]*)`", section))
    assert documented - {"skip"} <= textfile.PLAN_REASONS and "skip" in textfile.PLAN_DECISIONS


def test_one_read_is_bounded_in_files_and_bytes_and_says_what_it_left(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    for second in range(10):
        _record(root, second, second, {**APPLIED, "rank": second})
    (records.directory(root) / "20261202T060000Z-1-r0-deadbeef.json").symlink_to("/etc/passwd")
    found = records.read_newest(root, limit=4)
    assert len(found.records) == 4 and found.unread == 6
    assert "deadbeef" in found.skipped[0]  # the link, newest, passed over and said
    by_files = records.read_newest(root, limit=100, files=4)
    assert len(by_files.records) == 3 and by_files.unread == 7  # the link counts: files looked at
    size = len(found.records[0][1])
    by_bytes = records.read_newest(root, limit=100, max_bytes=2 * size)
    assert len(by_bytes.records) == 2 and by_bytes.unread == 8
    assert records.read_last(root, 2) == found.records[:2]


def test_a_held_back_plan_and_a_tight_margin_are_gauges_with_no_planted_label() -> None:
    """Issue 49: the alert names the plan and both numbers; the margin after applying and
    whether it is tight. Only a real fingerprint becomes a label."""
    fp = "0123456789abcdef"
    held = {
        **MISSED,
        "plan": {
            "decision": "profile",
            "reason": "unfinished-boot",
            "held_back": {
                "fingerprint": fp,
                "plan_kv_cache_memory_bytes": 50 << 30,
                "profiled_kv_cache_memory_bytes": 40 << 30,
            },
        },
    }
    tight = {
        **APPLIED,
        "plan": {**APPLIED["plan"], "margin": {"free_bytes": 1 << 29, "tight": True}},
    }
    samples = _samples(render([tight, held]))
    plan = (
        "plancache_boot_plan_held_back_bytes",
        (("fingerprint", fp), ("kind", "plan"), ("rank", "1")),
    )
    assert samples[plan] == 50 << 30
    assert (
        samples[(plan[0], (("fingerprint", fp), ("kind", "profiled"), ("rank", "1")))] == 40 << 30
    )
    decision = [k for k in samples if k[0] == "plancache_boot_decision" and ("rank", "1") in k[1]]
    assert dict(decision[0][1])["plan_reason"] == "unfinished-boot"
    assert samples[("plancache_boot_free_after_startup_bytes", (("rank", "0"),))] == 1 << 29
    assert samples[("plancache_boot_plan_tight", (("rank", "0"),))] == 1
    planted = {
        **held,
        "plan": {
            **held["plan"],
            "held_back": {**held["plan"]["held_back"], "fingerprint": 'x",evil="1'},
        },
    }
    assert "evil" not in render([planted])
