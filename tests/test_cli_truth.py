"""Exit codes and reports tell the truth (issue 19 item 3).

A reader that goes away (``| head``) never turns a failed audit into exit 0; ``verify --report
FILE`` is replaced on every outcome, internal errors included, and never replaces something
that is not a regular file (a device node, a FIFO, a directory, a symlink); every argument error,
whatever raised it, is one line on stderr (and one JSON document with ``--json``), exit 2.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import FP, plan_bytes
from plancache.cli.main import main
from plancache.storage.local.localdir import LocalPlanDir
from plancache.trust.plans.plan import plan_name

SRC = str(Path(__file__).resolve().parent.parent / "src")
FP2 = "fedcba9876543210"


@pytest.fixture
def audit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """A plan directory with two signed plans, one of them then altered (verify exits 1)."""
    assert main(["keygen", str(tmp_path / "ci")]) == 0
    local = LocalPlanDir(tmp_path / "plans")
    for fp in (FP, FP2):
        local.write(fp, plan_bytes(fp=fp), None)
    assert main(["sign", "--key", str(tmp_path / "ci"), str(local.path)]) == 0
    capsys.readouterr()
    return {"dir": str(local.path), "pub": str(tmp_path / "ci.pub"), "tmp": str(tmp_path)}


def _alter(audit: dict[str, str]) -> None:
    (Path(audit["dir"]) / plan_name(FP)).write_bytes(plan_bytes(kv=1))


def _cli(*argv: str, closed_stdout: bool = False) -> tuple[int, str]:
    """The CLI in its own process; with ``closed_stdout`` its reader is gone before it writes."""
    code = "import sys; from plancache.cli.main import main; sys.exit(main(sys.argv[1:]))"
    env = dict(os.environ, PYTHONPATH=SRC)
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None and proc.stderr is not None
    if closed_stdout:
        proc.stdout.close()  # as `| head -0` would: every write of the command meets a closed pipe
    else:
        proc.stdout.read()
    err = proc.stderr.read().decode()
    return proc.wait(120), err


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_a_closed_pipe_never_turns_a_failed_audit_into_success(
    audit: dict[str, str], json_flag: list[str]
) -> None:
    _alter(audit)
    code, err = _cli(
        "verify", *json_flag, "--trusted-keys", audit["pub"], audit["dir"], closed_stdout=True
    )
    assert code == 1, err
    assert "Traceback" not in err and "Exception ignored" not in err and "BrokenPipe" not in err, (
        err
    )
    code, err = _cli("verify", *json_flag, "--trusted-keys", audit["pub"], audit["dir"])
    assert code == 1
    (Path(audit["dir"]) / plan_name(FP)).write_bytes(plan_bytes())  # put the plan back: all valid
    code, err = _cli(
        "verify", *json_flag, "--trusted-keys", audit["pub"], audit["dir"], closed_stdout=True
    )
    assert code == 0, err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
@pytest.mark.parametrize("process_cli", [False, True])
@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_an_output_that_cannot_be_written_is_one_line_and_exit_2(
    audit: dict[str, str], json_flag: list[str], process_cli: bool
) -> None:
    """stdout on a full disk (``> report.json`` past a quota, /dev/full here): every plan is
    valid, but the report is lost, so the exit is 2 with one line saying why, not exit 1 and a
    traceback (which blamed the plans) nor 0 (which vouched for a report that is not there)."""
    args = "" if process_cli else "sys.argv[1:]"
    code = f"import sys; from plancache.cli.main import main; sys.exit(main({args}))"
    argv = ["verify", *json_flag, "--trusted-keys", audit["pub"], audit["dir"]]
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-c", code, *argv],
            stdout=full,
            stderr=subprocess.PIPE,
            env=dict(os.environ, PYTHONPATH=SRC),
            text=True,
            timeout=120,
        )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "plancache: error: cannot write the output: No space left on device"
    )
    assert _cli("verify", *json_flag, "--trusted-keys", audit["pub"], audit["dir"])[0] == 0


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_a_stderr_that_cannot_be_written_leaves_the_verdict_alone(audit: dict[str, str]) -> None:
    """The summary on stderr lost to a full disk is only messages: the exit is still the
    verdict (an uncaught OSError made an all-valid verify exit 1)."""
    code = "import sys; from plancache.cli.main import main; sys.exit(main())"
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-c", code, "verify", "--trusted-keys", audit["pub"], audit["dir"]],
            stdout=subprocess.DEVNULL,
            stderr=full,
            env=dict(os.environ, PYTHONPATH=SRC),
            timeout=120,
        )
    assert done.returncode == 0


def _report(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_the_report_is_replaced_by_a_failure_on_an_internal_error(
    audit: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    report = Path(audit["tmp"]) / "audit.json"
    assert (
        main(["verify", "--report", str(report), "--trusted-keys", audit["pub"], audit["dir"]]) == 0
    )
    assert _report(report)["ok"] is True
    capsys.readouterr()

    def bug(*args: object, **kwargs: object) -> None:  # a bug in the audit, whatever it is
        raise RuntimeError("a bug in the audit")

    monkeypatch.setattr("plancache.cli.plans.offline.audit_plans", bug)
    code = main(
        ["verify", "--json", "--report", str(report), "--trusted-keys", audit["pub"], audit["dir"]]
    )
    out, _err = capsys.readouterr()
    assert code == 2 and json.loads(out)["error"]["reason"] == "internal-error"
    after = _report(report)
    assert after["ok"] is False and after["error"]["reason"] == "internal-error", after
    assert "RuntimeError" in after["error"]["detail"]
    # no temporaries
    assert [p.name for p in report.parent.iterdir() if p.name.startswith(".audit.json")] == []


@pytest.mark.parametrize("kind", ["char-device", "fifo", "directory", "symlink"])
def test_the_report_never_replaces_what_is_not_a_regular_file(
    audit: dict[str, str], capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    target = Path(audit["tmp"]) / "target"
    if kind == "char-device":  # /dev/full's own numbers, in the test's directory
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(target, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "directory":
        target.mkdir()
    else:
        (Path(audit["tmp"]) / "elsewhere").write_text("keep me\n")
        target.symlink_to(Path(audit["tmp"]) / "elsewhere")
    before = os.lstat(target)
    code = main(
        ["verify", "--json", "--report", str(target), "--trusted-keys", audit["pub"], audit["dir"]]
    )
    out, err = capsys.readouterr()
    assert code == 2 and json.loads(out)["error"]["reason"] == "config-error", out
    assert "not a regular file" in err and len(err.strip().splitlines()) == 1
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (
        before.st_mode,
        before.st_ino,
        before.st_rdev,
    )
    if kind == "symlink":
        assert (Path(audit["tmp"]) / "elsewhere").read_text() == "keep me\n"


DEEP = "anon=" + "[" * 1000


@pytest.mark.parametrize(
    "argv",
    [
        ["ls", "--storage-option", DEEP, "file:///tmp"],
        ["verify", "--storage-option", DEEP, "file:///tmp"],
        ["pull", "--storage-option", DEEP, "file:///tmp"],
        ["push", "--storage-option", DEEP, ".", "file:///tmp"],
        ["prune", "--older-than", "1d", "--storage-option", DEEP, "file:///tmp"],
        ["compile-cache", "pull", "--storage-option", DEEP, "file:///tmp"],
        ["sign", "--fact", "x=" + '{"a":' * 1000, "."],
        ["ls", "--storage-option", "no-equals-sign-secret-AKIAEXAMPLE", "file:///tmp"],
        ["verify", "--jobs", "many", "."],
        ["verify", "--no-such-flag"],
        ["no-such-command"],
    ],
)
def test_every_argument_error_is_one_line_and_one_report(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    for flags in ([], ["--json"]):
        with pytest.raises(SystemExit) as info:
            main(
                argv[:1] + flags + argv[1:]
                if argv[0] != "compile-cache"
                else argv[:2] + flags + argv[2:]
            )
        out, err = capsys.readouterr()
        assert info.value.code == 2
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert "AKIAEXAMPLE" not in err + out
        if flags:
            doc = json.loads(out)  # exactly one document
            assert doc["ok"] is False and doc["error"]["reason"] == "usage-error"
        else:
            assert out == ""


def test_a_native_library_never_writes_before_the_report(audit: dict[str, str]) -> None:
    """PyKCS11's C layer prints its dlopen error on fd 1 itself: stdout must still be one
    document."""
    pytest.importorskip("PyKCS11")
    key = "pkcs11:token=ci;object=signer?module-path=/nonexistent/libsofthsm2.so&pin-value=1234"
    # as the console script runs it
    code = "import sys; from plancache.cli.main import main; sys.exit(main())"
    done = subprocess.run(
        [sys.executable, "-c", code, "sign", "--json", "--key", key, audit["dir"]],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=SRC),
    )
    assert done.returncode == 2
    doc = json.loads(done.stdout)  # exactly one document, nothing before it
    assert doc["error"]["reason"] == "config-error" and "PKCS#11 module" in doc["error"]["detail"]
    assert "nonexistent" in done.stderr  # the library's own words went to stderr


@pytest.mark.parametrize(
    ("blocked", "argv", "extra"),
    [
        (
            "PyKCS11",
            [
                "sign",
                "--key",
                "pkcs11:token=ci;object=signer?module-path=/x.so&pin-value=1",
                "{dir}",
            ],
            "pkcs11",
        ),
        ("s3fs", ["ls", "s3://bucket/plans"], "s3"),
        ("gcsfs", ["ls", "gs://bucket/plans"], "gcs"),
        ("adlfs", ["ls", "az://container/plans"], "azure"),
        ("boto3", ["sign", "--key", "awskms://alias/ci", "{dir}"], "awskms"),
    ],
)
def test_a_missing_optional_dependency_names_the_extra(
    audit: dict[str, str], blocked: str, argv: list[str], extra: str
) -> None:
    """As on a machine where that extra was never installed (the import fails)."""
    code = (
        f"import sys; sys.modules[{blocked!r}] = None\n"
        "from plancache.cli.main import main; sys.exit(main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, argv[0], "--json", *[a.format(**audit) for a in argv[1:]]],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=SRC),
    )
    doc = json.loads(done.stdout)
    assert done.returncode == 2 and doc["error"]["reason"] == "config-error", doc
    assert f"plancache[{extra}]" in doc["error"]["detail"] and "internal" not in done.stderr, (
        done.stderr
    )


def test_the_process_cli_leaves_its_heap_to_the_exit(
    audit: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The console script ends with the collector's view frozen: CPython's full collections at
    shutdown would walk the whole heap (~0.1 s once botocore is loaded: BENCHMARKS.md, issue 50
    item 7 (c)) to free what the exit frees anyway. What the exit owes still happens: atexit
    handlers run, the report is written whole, the exit code is the verdict. A caller's own
    process (``main(argv)``) keeps its collector."""
    _alter(audit)
    report = tmp_path / "report.json"
    code = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print(f'frozen={gc.get_freeze_count()}', file=sys.stderr))\n"
        "from plancache.cli.main import main; sys.exit(main())"
    )
    argv = ["verify", "--json", "--report", str(report), "--trusted-keys", audit["pub"]]
    done = subprocess.run(
        [sys.executable, "-c", code, *argv, audit["dir"]],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=SRC),
    )
    assert done.returncode == 1, done.stderr
    frozen = [line for line in done.stderr.splitlines() if line.startswith("frozen=")]
    assert len(frozen) == 1 and int(frozen[0].removeprefix("frozen=")) > 1000, done.stderr
    assert json.loads(done.stdout)["ok"] is False
    assert json.loads(report.read_text())["ok"] is False

    import gc

    before = gc.get_freeze_count()
    assert main(["verify", "--trusted-keys", audit["pub"], audit["dir"]]) == 1
    capsys.readouterr()
    assert gc.get_freeze_count() == before
