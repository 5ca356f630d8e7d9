"""The test tiers (docs/test-suite.md#tiers): every test file has one, the markers are registered,
the unit tier's files need nothing the other tiers stand for, and under ``CI=true`` a tier whose
prerequisite is missing fails instead of skipping."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

import conftest
from conftest import FILE_TIERS, LONGEST, SLOW, TIERS

TESTS = Path(__file__).resolve().parent
NOT_UNIT = re.compile(
    r"^\s*(?:from|import)\s+(?:vllm\b|torch\b|store_servers|azurite_server|kms_standins"
    r"|hostile_server|realtime|compile_boots|compile_zygote|compile_attacks|engine_boot|vllm_rank)",
    re.M,
)
"""A module-level or lazy import that puts a file outside the unit tier: vLLM or torch, a server or
stand-in, a wall-clock bound's allowance, a boot (the engine harness's own rules are unit)."""


def test_every_test_file_has_a_tier_and_every_tier_a_file() -> None:
    files = {path.name for path in TESTS.glob("test_*.py")}
    assert sorted(files - FILE_TIERS.keys()) == [], (
        "classify these in FILE_TIERS (tests/conftest.py)"
    )
    assert sorted(FILE_TIERS.keys() - files) == [], "FILE_TIERS names files that are gone"
    assert {tier for tiers in FILE_TIERS.values() for tier in tiers} == set(TIERS)
    for name, tiers in FILE_TIERS.items():
        assert tiers and set(tiers) <= set(TIERS) and len(set(tiers)) == len(tiers), name
        assert tiers == ("unit",) or "unit" not in tiers, f"{name}: the unit tier stands alone"


def test_the_tiers_are_the_registered_markers() -> None:
    ini = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"
    ]
    assert [line.split(":")[0] for line in ini["markers"]] == list(TIERS)
    assert "--strict-markers" in ini["addopts"].split()


def test_the_longest_files_are_vllm_or_engine_files() -> None:
    for name in LONGEST:
        assert {"vllm", "engine"} & set(FILE_TIERS[name]), name


def test_the_queued_files_exist_and_are_queued_once() -> None:
    """A file renamed or gone from :data:`LONGEST` or :data:`SLOW` would quietly run last."""
    queued = [*LONGEST, *SLOW]
    assert sorted(set(queued) - FILE_TIERS.keys()) == []
    assert len(set(queued)) == len(queued)


class _Item:
    """What the ordering hook reads of a collected test: its file and its name."""

    def __init__(self, file: str, name: str) -> None:
        self.path, self.name = Path(file), name

    def add_marker(self, marker: str) -> None:
        pass


def test_the_queued_files_come_first_in_their_order() -> None:
    """The :data:`LONGEST` files, then the :data:`SLOW` ones, each in its tuple's order, then the
    others as collected; a file's own tests keep their order."""
    collected = ["test_a.py", SLOW[1], "test_b.py", LONGEST[1], SLOW[0], LONGEST[0]]
    items = [_Item(file, name) for file in collected for name in ("one", "two")]
    conftest.pytest_collection_modifyitems(items)  # type: ignore[arg-type]  # duck-typed items
    expected = [LONGEST[0], LONGEST[1], SLOW[0], SLOW[1], "test_a.py", "test_b.py"]
    assert [(i.path.name, i.name) for i in items] == [
        (file, name) for file in expected for name in ("one", "two")
    ]


def test_unit_files_import_no_vllm_server_or_clock() -> None:
    unit = sorted(name for name, tiers in FILE_TIERS.items() if tiers == ("unit",))
    offending = {name: NOT_UNIT.findall((TESTS / name).read_text()) for name in unit}
    assert {name: found for name, found in offending.items() if found} == {}


def _skip_report(reason: str, *, xfail: bool = False) -> pytest.TestReport:
    report = pytest.TestReport(
        "tests/test_x.py::test_x",
        ("tests/test_x.py", 1, "test_x"),
        {},
        "skipped",
        ("tests/test_x.py", 1, f"Skipped: {reason}"),
        "setup",
    )
    if xfail:
        report.wasxfail = reason
    return report


@pytest.mark.parametrize(
    ("reason", "tier"),
    [
        ("vLLM is not installed", "vllm"),
        ("could not import 'vllm': No module named 'vllm'", "vllm"),
        ("Azurite not installed: scripts/bootstrap-test-env.sh installs it", "emulator"),
        ("SoftHSM2/OpenSC not installed (softhsm2-util)", "emulator"),
        ("could not import 'boto3': No module named 'boto3'", "emulator"),
    ],
)
def test_under_ci_a_missing_tier_prerequisite_fails(
    monkeypatch: pytest.MonkeyPatch, reason: str, tier: str
) -> None:
    monkeypatch.setenv("CI", "true")
    report = _skip_report(reason)
    conftest.fail_missing_prerequisite(report)
    assert (
        report.failed
        and report.longrepr == f"the {tier} tier cannot run under CI=true: Skipped: {reason}"
    )


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_elsewhere_a_missing_tier_prerequisite_skips(
    monkeypatch: pytest.MonkeyPatch, ci: str | None
) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    report = _skip_report("vLLM is not installed")
    conftest.fail_missing_prerequisite(report)
    assert report.skipped


@pytest.mark.parametrize(
    ("reason", "xfail"),
    [
        ("the configured package index cannot be reached", False),  # the machine's, not a tier's
        ("one CPU: nothing to move to", False),
        ("vLLM is not installed", True),  # an expected failure is no skip
    ],
)
def test_under_ci_other_skips_and_xfails_stay(
    monkeypatch: pytest.MonkeyPatch, reason: str, xfail: bool
) -> None:
    monkeypatch.setenv("CI", "true")
    report = _skip_report(reason, xfail=xfail)
    conftest.fail_missing_prerequisite(report)
    assert report.skipped


def test_a_skipped_collection_fails_under_ci_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """``pytest.importorskip`` at module level skips the file's collection, not a test."""
    monkeypatch.setenv("CI", "1")
    report = pytest.CollectReport(
        "tests/test_x.py",
        "skipped",
        ("tests/test_x.py", 35, "Skipped: could not import 'vllm': No module named 'vllm'"),
        [],
    )
    conftest.fail_missing_prerequisite(report)
    assert report.failed and "the vllm tier cannot run under CI=true" in str(report.longrepr)


class _Config:
    def __init__(self, markexpr: str) -> None:
        self.markexpr = markexpr

    def getoption(self, name: str, default: str = "") -> str:
        assert name == "markexpr"
        return self.markexpr


@pytest.mark.parametrize(
    ("markexpr", "name", "ignored"),
    [
        ("unit", "test_compile_cache_vllm.py", True),  # importing it imports vLLM
        ("unit", "test_trust_plan.py", None),
        ("not vllm and not engine", "test_vllm_plugin.py", True),
        ("not vllm and not engine", "test_store_faults.py", None),
        ("emulator and not realtime", "test_store_faults.py", True),
        ("unit", "test_not_classified.py", None),  # collected: test_tiers fails for it instead
        ("", "test_compile_cache_vllm.py", None),
        # not tiers only: pytest deselects
        ("unit or parametrize", "test_compile_cache_vllm.py", None),
    ],
)
def test_a_tier_expression_leaves_files_that_cannot_match_uncollected(
    markexpr: str, name: str, ignored: bool | None
) -> None:
    assert conftest.pytest_ignore_collect(TESTS / name, _Config(markexpr)) is ignored
