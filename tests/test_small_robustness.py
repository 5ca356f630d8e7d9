"""Small robustness fixes of issue 40: a Retry-After that is not ASCII digits, an empty expiry
variable that is set, and a benchmark counter that must not print a figure it did not measure.
(How the retries treat such a Retry-After is tested on fake time in tests/test_deadlines.py.)"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from plancache.storage import deadline
from plancache.vllm_plugin import plugin_state
from plancache.vllm_plugin.compile_cache import guard_settings

REPO = Path(__file__).resolve().parents[1]


class _Throttled(Exception):
    """A store's throttled answer as botocore raises it (status and headers in ``response``)."""

    def __init__(self, retry_after: str) -> None:
        super().__init__("SlowDown")
        self.response = {
            "ResponseMetadata": {"HTTPStatusCode": 503, "HTTPHeaders": {"retry-after": retry_after}}
        }


@pytest.mark.parametrize(
    "value", ["²", "١٢", "-1", "1e3", "1.5", "+3", "", " ", "3 s", "0x10", "Ⅻ", "\U0001d7d7"]
)
def test_a_retry_after_that_is_not_ascii_digits_is_absent(value: str) -> None:
    assert deadline.retry_after(_Throttled(value)) is None


def test_ascii_digits_are_read_and_huge_ones_capped() -> None:
    assert deadline.retry_after(_Throttled(" 7 ")) == 7.0
    assert deadline.retry_after(_Throttled("0")) == 0.0
    # no int/float of 5000 digits
    assert deadline.retry_after(_Throttled("9" * 5000)) == deadline.RETRY_AFTER_CAP
    assert deadline.retry_after(_Throttled("99999999999999999999")) == deadline.RETRY_AFTER_CAP
    odd = _Throttled("1")
    odd.response = {"ResponseMetadata": "not a dict"}
    assert deadline.retry_after(odd) is None


@pytest.mark.parametrize("raw", ["", " ", "\t\n"])
def test_a_set_but_empty_expiry_is_a_configuration_error(raw: str) -> None:
    value, problem = guard_settings._expiry(raw)
    assert value is None and problem.startswith(guard_settings.EXPIRES_ENV) and "empty" in problem
    assert guard_settings._expiry(None) == (None, "")  # unset: no expiry, no problem


@pytest.mark.parametrize(("raw", "signs"), [(" ", False), (None, True)])
def test_the_plugin_logs_one_error_and_signs_nothing_when_the_expiry_is_set_empty(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    raw: str | None,
    signs: bool,
) -> None:
    from plancache.cli.main import main

    assert main(["keygen", str(tmp_path / "key")]) == 0
    for name in [n for n in os.environ if n.startswith("PLANCACHE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PLANCACHE_SIGNING_KEY", str(tmp_path / "key"))
    if raw is not None:
        monkeypatch.setenv(guard_settings.EXPIRES_ENV, raw)
    plugin_state.start_boot()  # a boot of its own: the settings are read once a boot
    try:
        with caplog.at_level(logging.ERROR, logger="vllm.plancache"):
            config = guard_settings.settings()
            signer = guard_settings.signer()
    finally:
        plugin_state.start_boot()
    assert config is not None and config.expires_in is None
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    if signs:
        assert signer is not None and not errors and config.expiry_problem == ""
    else:
        assert signer is None and len(errors) == 1 and guard_settings.EXPIRES_ENV in errors[0]
        assert "new caches stay unsigned" in errors[0]


def _bench() -> Any:
    """scripts/bench_compile_cache.py as a module (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location(
        "bench_compile_cache", REPO / "scripts" / "bench_compile_cache.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_compile_cache_benchmark_counts_the_reads_a_pull_makes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import make_signer
    from plancache.pipeline.compile_cache import flows as cc
    from plancache.pipeline.compile_cache.local_caches import CacheRoot
    from plancache.trust.keyring.keys import signer_keyring

    bench = _bench()
    root = CacheRoot(tmp_path / "built")
    bench.synthetic(root, mib=1, files=4)
    signer, now = make_signer(), datetime.now(timezone.utc)
    cc.sign_cache(root, bench.SUBJECT, signer, now)
    assert bench.pull_reads(tmp_path, root, signer_keyring(signer), now) == 2
    assert "2 object reads" in capsys.readouterr().out


def test_a_benchmark_that_counted_nothing_says_so_and_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import make_signer
    from plancache.pipeline.compile_cache import flows as cc
    from plancache.pipeline.compile_cache.local_caches import CacheRoot
    from plancache.trust.keyring.keys import signer_keyring

    bench = _bench()

    @contextlib.contextmanager
    def blind() -> Iterator[list[str]]:
        yield []  # a counter on a path the reads do not take

    monkeypatch.setattr(bench, "counting_reads", blind)
    root = CacheRoot(tmp_path / "built")
    bench.synthetic(root, mib=1, files=2)
    signer, now = make_signer(), datetime.now(timezone.utc)
    cc.sign_cache(root, bench.SUBJECT, signer, now)
    assert bench.pull_reads(tmp_path, root, signer_keyring(signer), now) == 0
    out = capsys.readouterr().out
    assert "not measured: counter saw no reads" in out and "0 object reads" not in out
    monkeypatch.setattr(bench, "bench_verify", lambda work, rounds: 0)
    monkeypatch.setattr(
        sys, "argv", ["bench_compile_cache.py", "--skip-vllm", "--work", str(tmp_path / "w")]
    )
    with pytest.raises(SystemExit) as exited:
        bench.main()
    assert exited.value.code == 1
