"""The engine harness's own rules, without booting anything: a missing engine venv skips the
engine tests on a developer's machine and fails them under CI (a skipped engine test must not
pass a CI run)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import engine_harness as H


@pytest.fixture
def no_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(H, "ENGINE_VENV", tmp_path / "venv")
    monkeypatch.setattr(H, "ENGINE_PY", tmp_path / "venv" / "bin" / "python")
    return tmp_path / "venv"


@pytest.mark.parametrize("ci", ["true", "1", "yes"])
def test_missing_engine_fails_under_ci(
    no_engine: Path, monkeypatch: pytest.MonkeyPatch, ci: str
) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(
        pytest.fail.Exception, match="engine tests cannot run in CI: no engine venv"
    ):
        H.require_engine()


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_missing_engine_skips_elsewhere(
    no_engine: Path, monkeypatch: pytest.MonkeyPatch, ci: str | None
) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match="no engine venv"):
        H.require_engine()


def test_an_engine_venv_without_its_stamp_is_incomplete(
    no_engine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bootstrap writes the stamp last: a venv an interrupted install left is not used."""
    (no_engine / "bin").mkdir(parents=True)
    (no_engine / "bin" / "python").write_text("")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="incomplete"):
        H.require_engine()
    (no_engine / ".plancache-engine.stamp").write_text("x\n")
    assert H.engine_missing() is None


def test_server_flags_are_the_llm_arguments() -> None:
    """``vllm serve`` and ``LLM()`` boot the same engine (tests/engine_boot.py's ENGINE_ARGS)."""
    flags = H.serve_flags(Path("/m"), 8000)
    assert flags[:6] == ["--model", "/m", "--host", "127.0.0.1", "--port", "8000"]
    assert "--kv-cache-memory-bytes" in flags and flags[
        flags.index("--kv-cache-memory-bytes") + 1
    ] == str(64 * 2**20)
