"""The offline CLI: keygen, sign, verify, ls, inspect, demo -- exit codes, tables, JSON, errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from conftest import FP, GIB, NOW, plan_bytes
from plancache.cli.main import main
from plancache.storage.local.localdir import LocalPlanDir
from plancache.trust.plans.plan import plan_name, sig_name

FP2 = "fedcba9876543210"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    code, out, _ = run(capsys, "keygen", str(tmp_path / "ci"))
    assert code == 0 and "key id SHA256:" in out
    return tmp_path / "ci"


@pytest.fixture
def plans(plan_dir: Path) -> Path:
    local = LocalPlanDir(plan_dir)
    local.write(FP, plan_bytes(), None)
    local.write(FP2, plan_bytes(fp=FP2, kv=GIB, baseline=2 * GIB), None)
    return plan_dir


def test_sign_then_verify_then_ls(
    capsys: pytest.CaptureFixture[str], keys: Path, plans: Path
) -> None:
    trusted = f"--trusted-keys={keys}.pub"
    code, out, err = run(capsys, "verify", trusted, str(plans))
    assert code == 1 and [line.split()[1] for line in out.splitlines()[1:]] == [
        "unsigned",
        "unsigned",
    ]
    code, out, err = run(
        capsys,
        "sign",
        "--key",
        str(keys),
        "--expires-in",
        "30d",
        "--comment",
        "ci run 7",
        "--fact",
        "gpu_memory_utilization=0.9",
        str(plans),
    )
    assert code == 0 and "2 signed" in err
    code, out, err = run(capsys, "sign", "--key", str(keys), str(plans))
    assert code == 0 and "2 already signed" in err
    code, out, err = run(capsys, "verify", trusted, "--json", str(plans))
    report = json.loads(out)
    assert code == 0 and report["ok"] and {p["status"] for p in report["plans"]} == {"valid"}
    assert report["plans"][0]["comment"] == "ci run 7" and report["plans"][0]["expires_at"]
    code, out, err = run(capsys, "ls", trusted, str(plans))
    assert code == 0 and "20.00" in out and "70.00" in out and out.count("valid") == 2
    code, out, err = run(capsys, "ls", str(plans))
    assert code == 0 and "unverified" in out and "unverified" in err


def test_verify_reports_each_bad_plan(
    capsys: pytest.CaptureFixture[str], keys: Path, plans: Path
) -> None:
    run(capsys, "sign", "--key", str(keys), str(plans))
    (plans / plan_name(FP)).write_bytes(plan_bytes(kv=30 * GIB))
    code, out, _err = run(capsys, "verify", f"--trusted-keys={keys}.pub", "--json", str(plans))
    by_fp = {p["fingerprint"]: p for p in json.loads(out)["plans"]}
    assert code == 1
    assert by_fp[FP]["reason"] == "digest-mismatch" and by_fp[FP2]["status"] == "valid"


def test_co_signing_for_a_threshold(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, keys: Path, plans: Path
) -> None:
    run(capsys, "keygen", str(tmp_path / "second"))
    both = tmp_path / "trusted"
    both.write_text((tmp_path / "ci.pub").read_text() + (tmp_path / "second.pub").read_text())
    run(capsys, "sign", "--key", str(keys), str(plans))
    assert run(capsys, "verify", f"--trusted-keys={both}", "--threshold", "2", str(plans))[0] == 1
    # without trusted keys the second signer cannot check what it would adopt: refused, nothing
    # written
    before = {p.name: p.read_bytes() for p in plans.iterdir()}
    code, out, _ = run(capsys, "sign", "--key", str(tmp_path / "second"), "--json", str(plans))
    assert code == 1 and {p["action"] for p in json.loads(out)["plans"]} == {
        "refused (untrusted-key)"
    }
    assert {p.name: p.read_bytes() for p in plans.iterdir()} == before
    code, _, err = run(
        capsys, "sign", "--key", str(tmp_path / "second"), f"--trusted-keys={keys}.pub", str(plans)
    )
    assert code == 0 and "2 co-signed" in err
    assert run(capsys, "verify", f"--trusted-keys={both}", "--threshold", "2", str(plans))[0] == 0


def test_sign_adopts_nothing_it_was_not_asked_to_sign(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, keys: Path, plans: Path
) -> None:
    run(capsys, "keygen", str(tmp_path / "second"))
    # no expiry
    run(capsys, "sign", "--key", str(keys), "--fact", "gpu_memory_utilization=0.9", str(plans))
    code, out, _ = run(
        capsys,
        "sign",
        "--key",
        str(tmp_path / "second"),
        f"--trusted-keys={keys}.pub",
        "--expires-in",
        "30d",
        "--json",
        str(plans),
    )
    assert code == 1 and {p["action"] for p in json.loads(out)["plans"]} == {
        "refused (statement-mismatch)"
    }
    code, out, _ = run(
        capsys,
        "sign",
        "--key",
        str(tmp_path / "second"),
        f"--trusted-keys={keys}.pub",
        "--expires-in",
        "30d",
        "--replace",
        "--json",
        str(plans),
    )
    assert code == 0 and {p["action"] for p in json.loads(out)["plans"]} == {"replaced"}
    # the first key's signature is gone
    assert run(capsys, "verify", f"--trusted-keys={keys}.pub", str(plans))[0] == 1
    assert run(capsys, "verify", f"--trusted-keys={tmp_path / 'second'}.pub", str(plans))[0] == 0


def test_sign_refuses_malformed_plans(
    capsys: pytest.CaptureFixture[str], keys: Path, plan_dir: Path
) -> None:
    (plan_dir / plan_name(FP)).write_text(
        '{"schema": 1, "fingerprint": "' + FP + '", "kv_cache_memory_bytes": true, '
        '"free_memory_baseline": 2}'
    )
    code, out, _ = run(capsys, "sign", "--key", str(keys), "--json", str(plan_dir))
    assert code == 1 and json.loads(out)["plans"][0]["action"] == "refused (malformed)"
    assert not (plan_dir / sig_name(FP)).exists()


def test_inspect(capsys: pytest.CaptureFixture[str], keys: Path, plans: Path) -> None:
    run(capsys, "sign", "--key", str(keys), str(plans))
    code, out, _ = run(
        capsys, "inspect", "--json", f"--trusted-keys={keys}.pub", str(plans / sig_name(FP))
    )
    info = json.loads(out)
    assert code == 0 and info["status"] == "valid" and info["statement"]["fingerprint"] == FP
    code, out, _ = run(capsys, "inspect", str(plans / plan_name(FP)))
    assert code == 0 and "unverified" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["verify", "/nonexistent/dir"], "no trusted keys"),
        (["verify", "--trusted-keys=/nonexistent/keys", "."], "does not exist"),
        (["sign", "/tmp"], "no signing key"),
        (["sign", "--key", "/nonexistent/key", "/tmp"], "does not exist"),
        (["inspect", "/tmp/not-a-plan.json"], "is not named"),
    ],
)
def test_user_errors_are_one_line_exit_2(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    message: str,
) -> None:
    monkeypatch.delenv("PLANCACHE_TRUSTED_KEYS", raising=False)
    monkeypatch.delenv("PLANCACHE_SIGNING_KEY", raising=False)
    code, _out, err = run(capsys, *argv)
    assert (
        code == 2
        and message in err
        and len(err.strip().splitlines()) == 1
        and "Traceback" not in err
    )


def test_bad_flag_values_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["sign", "--expires-in", "soon"])
    assert info.value.code == 2 and "not a duration" in capsys.readouterr().err


def test_environment_supplies_keys(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, keys: Path, plans: Path
) -> None:
    monkeypatch.setenv("PLANCACHE_SIGNING_KEY", str(keys))
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", f"{keys}.pub")
    assert run(capsys, "sign", str(plans))[0] == 0
    assert run(capsys, "verify", str(plans))[0] == 0


def test_defaults_to_vllm_plan_directory(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, keys: Path
) -> None:
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    LocalPlanDir(tmp_path / "cache" / "startup_plan").write(FP, plan_bytes(), None)
    assert run(capsys, "sign", "--key", str(keys))[0] == 0
    code, out, _ = run(capsys, "verify", f"--trusted-keys={keys}.pub")
    assert code == 0 and FP in out


def test_parallel_verify_matches_serial(
    capsys: pytest.CaptureFixture[str], keys: Path, plan_dir: Path
) -> None:
    local = LocalPlanDir(plan_dir)
    fps = [f"{i:016x}" for i in range(300)]
    for fp in fps:
        local.write(fp, plan_bytes(fp=fp), None)
    run(capsys, "sign", "--key", str(keys), str(plan_dir))
    (plan_dir / plan_name(fps[7])).write_bytes(plan_bytes(fp=fps[7], kv=3))
    serial = json.loads(
        run(capsys, "verify", f"--trusted-keys={keys}.pub", "--json", "--jobs", "1", str(plan_dir))[
            1
        ]
    )
    code, out, _ = run(
        capsys, "verify", f"--trusted-keys={keys}.pub", "--json", "--jobs", "2", str(plan_dir)
    )
    assert code == 1 and json.loads(out) == serial
    assert [p["fingerprint"] for p in serial["plans"] if p["status"] != "valid"] == [fps[7]]


@pytest.mark.parametrize(
    ("plans", "jobs"), [(200, 2), (1000, 2), (10_000, 2), (10_000, 8), (99_999, 3)]
)
def test_a_pool_gets_its_plans_in_order_in_chunks_that_shrink(plans: int, jobs: int) -> None:
    """Every plan once, in input order (reports come back in it); chunks never growing, none
    over 1000, and the last ones of at most 32 plans: the pool ends when its slowest worker
    does, so what is left at the end must be short."""
    from plancache.pipeline.audit import _guided_chunks

    chunks = _guided_chunks(list(range(plans)), jobs)
    sizes = [len(c) for c in chunks]
    assert [p for c in chunks for p in c] == list(range(plans))
    assert sizes == sorted(sizes, reverse=True) and max(sizes) <= 1000
    assert sizes[-2] <= 32 and min(sizes[:-1]) >= 32  # no round trip for a handful


def _collector_state(args: tuple[list[str], object, object, object]) -> list[object]:
    """A pool task reporting, for each plan, whether its worker's cyclic collector is on."""
    import gc

    from plancache.pipeline.audit import PlanReport

    return [PlanReport(fp, "valid", "ok", str(gc.isenabled())) for fp in args[0]]


def test_the_pool_parent_pauses_its_collector_and_each_worker_keeps_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a pool verifies, its parent only gathers reports (no cycles): its collector is off
    then, and on again after (the full passes over a growing list cost the parent ~20 ms of CPU
    on the workers' cores). A forked worker starts from the parent's state: it turns its own
    collector back on, so a worker's cyclic garbage is still collected."""
    import gc

    from plancache.pipeline import audit

    monkeypatch.setattr(audit, "_check_chunk", _collector_state)
    seen: list[bool] = []

    class Progress:
        def start(self, total: int) -> None: ...

        def advance(self, count: float = 1) -> None:
            seen.append(gc.isenabled())

    fps = [f"{i:016x}" for i in range(audit.POOL_MIN_PLANS)]
    assert gc.isenabled()
    reports = audit.check_many(fps, None, NOW, jobs=2, progress=Progress())
    assert gc.isenabled()
    assert seen and not any(seen)
    assert [r.fingerprint for r in reports] == fps and {r.detail for r in reports} == {"True"}


def test_a_report_crosses_the_pool_whole() -> None:
    """Workers send reports back pickled as their field values in order (``__reduce__``): every
    field, set to something other than its default, must arrive in its own place."""
    import pickle
    from dataclasses import fields

    from plancache.pipeline.audit import PlanReport

    values = {f.name: f"{f.name}-value" for f in fields(PlanReport)}
    values.update(signers=["a", "b"], signer_ids=["SHA256:x"], keyless=[{"identity": "i"}])
    values.update(candidates=[{"digest": "d"}], kv_cache_memory_bytes=1, free_memory_baseline=2)
    values.update(provenance={"p": 1}, inputs={"i": 2}, config_parts={"c": 3}, evidence="none")
    report = PlanReport(**values)
    back = pickle.loads(pickle.dumps([report, report]))
    assert back == [report, report] and vars(back[0]) == values


@given(
    st.lists(
        st.text(
            alphabet=st.sampled_from(list("aZ09 -_/.:=@\\\x1b\u202e\u00e9eyJpinPIN")), max_size=12
        ),
        min_size=1,
        max_size=6,
    )
)
@example(["0123456789abcdef", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"])
@settings(max_examples=300, deadline=None)
def test_a_plain_column_is_one_safe_text_cell_by_cell(texts: list[str]) -> None:
    """``print_table`` passes a column whose texts joined are ``is_plain`` through unescaped: it
    must be the column ``safe_text`` gives cell by cell, and ``is_plain`` of the joined texts
    must never hold when one of them would be changed (an escape, a redaction)."""
    import io

    from plancache.cli.output import CELL_LIMIT, print_table
    from plancache.trust.display import is_plain, safe_text

    if is_plain(" ".join(texts)):
        assert all(safe_text(t, CELL_LIMIT) == t for t in texts)
    table = io.StringIO()
    print_table([[t] for t in texts], ["H"], table)
    cells = ["H", *(safe_text(t, CELL_LIMIT) for t in texts)]
    width = max(map(len, cells))
    assert table.getvalue() == "".join(c.ljust(width).rstrip() + "\n" for c in cells)


def test_table_cells_are_escaped_as_each_alone() -> None:
    """``print_table`` escapes each distinct text once: the table must be what escaping every
    cell on its own gives, for repeated, hostile and non-text cells (``True`` is not ``1``)."""
    import io

    from plancache.cli.output import CELL_LIMIT, print_table
    from plancache.trust.display import safe_text

    rows = [
        ["ci", 1, "s3://user:secret@bucket/x", None],
        ["ci", True, "s3://user:secret@bucket/x", "a\x1b[31mred"],
        ["é\u202e", 1.0, "1", "x" * 400],
        ["ci", False, "", 0],
    ]
    headers = ["A", "B", "C", "D"]
    cells = [headers] + [["" if c is None else safe_text(c, CELL_LIMIT) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    expected = "".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in cells
    )
    out = io.StringIO()
    print_table(rows, headers, out)
    assert out.getvalue() == expected
    assert "True" in expected and "secret" not in expected and "\x1b" not in expected
    empty = io.StringIO()
    print_table([], headers, empty)
    assert empty.getvalue() == "A  B  C  D\n"  # no rows: the headers alone


def test_console_script_demo_and_help() -> None:
    exe = shutil.which("plancache", path=os.path.dirname(sys.executable)) or shutil.which(
        "plancache"
    )
    cmd = [exe] if exe else [sys.executable, "-m", "plancache.cli.main"]
    demo = subprocess.run([*cmd, "demo"], capture_output=True, text=True, timeout=120)
    assert demo.returncode == 0, demo.stderr
    assert "applied" in demo.stdout and "below-baseline" in demo.stdout
    for sub in ("keygen", "sign", "verify", "ls", "inspect", "demo"):
        helped = subprocess.run([*cmd, sub, "--help"], capture_output=True, text=True, timeout=60)
        assert helped.returncode == 0 and "usage: plancache" in helped.stdout


def test_storage_options_come_from_the_environment_and_flags_win(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, keys: Path
) -> None:
    import argparse

    from plancache.cli.flag_objects import storage_options

    monkeypatch.setenv(
        "PLANCACHE_STORAGE_OPTIONS", '{"anon": false, "config_kwargs": {"read_timeout": 2}}'
    )
    args = argparse.Namespace(storage_option=[("anon", True)])
    assert storage_options(args) == {"anon": True, "config_kwargs": {"read_timeout": 2}}
    monkeypatch.setenv("PLANCACHE_STORAGE_OPTIONS", "endpoint_url=http://127.0.0.1:9 anon=true")
    assert storage_options(argparse.Namespace(storage_option=None)) == {
        "endpoint_url": "http://127.0.0.1:9",
        "anon": True,
    }
    monkeypatch.setenv("PLANCACHE_STORAGE_OPTIONS", "[1, 2]")
    code, _, err = run(capsys, "verify", f"--trusted-keys={keys}.pub", "memory://plans")
    assert code == 2 and "PLANCACHE_STORAGE_OPTIONS" in err and len(err.strip().splitlines()) == 1


def test_rotating_a_stores_plans_to_a_new_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, keys: Path, plans: Path
) -> None:
    """Co-sign with the new key, push, then retire the old one: at every step every plan in the
    store verifies under the trusted keys a node has, so no boot has to profile."""
    store = (tmp_path / "bucket").as_uri()
    run(capsys, "keygen", str(tmp_path / "new"))
    old_line = (tmp_path / "ci.pub").read_text().strip()
    new_line = (tmp_path / "new.pub").read_text().strip()
    trusted = tmp_path / "trusted"
    assert run(capsys, "push", "--key", str(keys), str(plans), store)[0] == 0
    trusted.write_text(f"{old_line}\n{new_line}\n")  # 1. both keys trusted
    assert run(capsys, "verify", f"--trusted-keys={trusted}", store)[0] == 0
    code, _, err = run(
        capsys, "sign", "--key", str(tmp_path / "new"), f"--trusted-keys={trusted}", str(plans)
    )
    assert code == 0 and "2 co-signed" in err  # 2. co-sign and push
    assert run(capsys, "push", str(plans), store)[0] == 0
    # 3. retire the old key
    trusted.write_text(f"valid-before=2000-01-01T00:00:00Z {old_line}\n{new_line}\n")
    code, out, _ = run(capsys, "verify", f"--trusted-keys={trusted}", "--json", store)
    assert code == 0 and {tuple(p["signers"]) for p in json.loads(out)["plans"]} == {("new",)}
    only_old = tmp_path / "only-old"
    # the old key alone vouches for nothing
    only_old.write_text(f"valid-before=2000-01-01T00:00:00Z {old_line}\n")
    code, out, _ = run(capsys, "verify", f"--trusted-keys={only_old}", "--json", store)
    assert code == 1 and {p["reason"] for p in json.loads(out)["plans"]} == {"expired"}
