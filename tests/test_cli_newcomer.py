"""Issue 21 as a newcomer meets it, against moto's S3 server and local directories: argument
errors that name the nearest word and the command's own help, no silent abbreviations, DIR and
URL never mistaken for each other, ``inspect`` of a plan in a bucket."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from cli_support import (
    keys,  # noqa: F401 - a fixture, named as a parameter
    run,
    s3,  # noqa: F401 - a fixture, named as a parameter
)
from conftest import FP, plan_bytes
from plancache.cli.main import main
from plancache.storage.local.localdir import LocalPlanDir
from plancache.trust.plans.plan import plan_name
from store_servers import (
    AWS_ENV,
    MotoServer,
    moto_server,  # noqa: F401 - a fixture, named as a parameter
)

FACTS = (
    "--fact",
    "gpu_memory_utilization=0.9",
    "--fact",
    "device_name=x",
    "--fact",
    "device_total_memory=85899345920",
)


def signed_dir(path: Path, key: Path, *fps: str) -> LocalPlanDir:
    local = LocalPlanDir(path)
    for fp in fps:
        local.write(fp, plan_bytes(fp=fp), None)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["sign", "--key", str(key), *FACTS, str(path)]) == 0
    return local


def pushed_plan(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, keys: Path, s3: MotoServer
) -> str:
    """A plan FP signed by ``keys`` and pushed to a new bucket's ``team/`` prefix: its URL."""
    signed_dir(tmp_path / "plans", keys, FP)
    url = f"s3://{s3.new_bucket()}/team"
    assert run(capsys, "push", str(tmp_path / "plans"), url)[0] == 0
    return url


# -- argument errors (item 3) ---------------------------------------------------------------------


def test_a_misspelled_option_names_the_nearest_one_and_the_commands_own_help(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run(capsys, "verify", "--trusted-kyes", "k.pub", str(tmp_path))
    assert code == 2 and not out
    assert err.strip() == (
        "plancache verify: error: unknown option '--trusted-kyes'; did you mean '--trusted-keys'? "
        "(see plancache verify --help)"
    )


def test_a_misspelled_option_under_json_fills_command(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run(capsys, "pull", "--json", "--fingerprnt", FP, "s3://b/p", str(tmp_path))
    doc = json.loads(out)
    assert code == 2 and doc["command"] == "pull" and doc["error"]["reason"] == "usage-error"
    assert (
        "'--fingerprint'" in doc["error"]["detail"]
        and "plancache pull --help" in doc["error"]["detail"]
    )


def test_a_nested_command_reports_its_own_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "compile-cache", "verify", "--trusted-kes", "k")
    assert (
        code == 2 and "plancache compile-cache verify: error:" in err and "'--trusted-keys'" in err
    )
    assert "see plancache compile-cache verify --help" in err


@pytest.mark.parametrize(
    ("argv", "meant", "help_of"),
    [
        (("verfy", "x"), "verify", "plancache"),
        (("compile-cache", "sgn"), "sign", "plancache compile-cache"),
        (("keygen", "--format", "pen", "k"), "pem", "plancache keygen"),
    ],
)
def test_a_misspelled_choice_names_the_nearest(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], meant: str, help_of: str
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2 and f"did you mean {meant!r}?" in err and f"(see {help_of} --help)" in err


def test_no_option_is_taken_as_a_prefix(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, keys: Path
) -> None:
    signed_dir(tmp_path / "plans", keys, FP)
    code, _, err = run(capsys, "verify", "--trusted-key", f"{keys}.pub", str(tmp_path / "plans"))
    assert code == 2 and "unknown option '--trusted-key'; did you mean '--trusted-keys'?" in err
    assert "not abbreviated" in err


def test_an_option_before_the_command_says_where_it_goes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "--json", "ls", "x")
    doc = json.loads(out)
    assert (
        code == 2
        and doc["command"] == "ls"
        and "--json goes after the command" in doc["error"]["detail"]
    )


def test_extra_positionals_are_named_as_such(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "pull", "s3://b/p", "dir", "more")
    assert code == 2 and "plancache pull: error: unexpected argument: more" in err


# -- DIR and URL (item 3) -------------------------------------------------------------------------


def test_push_with_url_and_dir_swapped_says_so_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, keys: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    signed_dir(tmp_path / "plans", keys, FP)
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "push", "s3://bucket/prefix", "plans")
    assert code == 2 and "DIR and URL are swapped: plancache push DIR URL" in err
    assert "'s3://bucket/prefix' as DIR" in err and not (tmp_path / "s3:").exists()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ("pull", "plans", "s3://bucket/prefix"),
            "DIR and URL are swapped: plancache pull URL DIR",
        ),
        (("pull", "plans"), "URL 'plans' is not a store URL"),
        (
            ("pull", "s3://b/p", "s3://b/q"),
            "DIR 's3://b/q' is a store URL, not a local plan directory",
        ),
        (
            ("sign", "--key", "k", "s3://b/p"),
            "DIR 's3://b/p' is a store URL, not a local plan directory (plancache sign DIR)",
        ),
    ],
)
def test_a_url_for_a_directory_or_the_reverse_names_the_argument(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: tuple[str, ...], said: str, keys: Path
) -> None:
    code, _, err = (
        run(capsys, *argv, "--trusted-keys", f"{keys}.pub")
        if argv[0] == "pull"
        else run(capsys, *argv)
    )
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1


# -- inspect URL (item 3) -------------------------------------------------------------------------


def test_inspect_reads_a_plan_from_a_store_url(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, keys: Path, s3: MotoServer
) -> None:
    url = pushed_plan(capsys, tmp_path, keys, s3)
    code, out, _ = run(
        capsys, "inspect", "--json", "--trusted-keys", f"{keys}.pub", f"{url}/{plan_name(FP)}"
    )
    doc = json.loads(out)
    assert code == 0 and doc["status"] == "valid" and doc["file"] == f"{url}/{plan_name(FP)}"
    assert doc["statement"]["provenance"]["device_name"] == "x"
    # what, not when
    code, _, err = run(
        capsys, "inspect", "--timeout", "30", f"{url}/{plan_name('0123456789abcdee')}"
    )
    assert code == 2 and "does not exist" in err


# -- re-profiled plans (item 2) -------------------------------------------------------------------


def test_signing_a_re_profiled_plan_says_digest_mismatch_and_advises_replace(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, keys: Path
) -> None:
    local = signed_dir(tmp_path / "plans", keys, FP)
    # re-profiled: new bytes, the old sidecar
    local.write(FP, plan_bytes(kv=21 * 2**30), local.read(FP)[1])
    code, out, _ = run(capsys, "sign", "--json", "--key", str(keys), *FACTS, str(local.path))
    (row,) = json.loads(out)["plans"]
    assert code == 1 and row["action"] == "refused (digest-mismatch)"
    assert "changed since it was signed" in row["detail"] and "--replace" in row["detail"]
    assert "co-sign" not in row["detail"]
    # with the trusted keys given too, the same reason and advice (co-signing cannot help)
    code, out, _ = run(
        capsys,
        "sign",
        "--json",
        "--key",
        str(keys),
        "--trusted-keys",
        f"{keys}.pub",
        *FACTS,
        str(local.path),
    )
    assert code == 1 and json.loads(out)["plans"][0]["action"] == "refused (digest-mismatch)"
    code, out, _ = run(
        capsys, "sign", "--json", "--replace", "--key", str(keys), *FACTS, str(local.path)
    )
    assert code == 0 and json.loads(out)["plans"][0]["action"] == "replaced"
    assert run(capsys, "verify", "--trusted-keys", f"{keys}.pub", str(local.path))[0] == 0


def test_push_key_of_a_re_profiled_plan_refuses_with_the_same_advice(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, keys: Path
) -> None:
    local = signed_dir(tmp_path / "plans", keys, FP)
    local.write(FP, plan_bytes(kv=21 * 2**30), local.read(FP)[1])
    url = (tmp_path / "store").as_uri()
    code, _, err = run(capsys, "push", "--key", str(keys), *FACTS, str(local.path), url)
    assert code == 1 and "digest-mismatch" in err and "--replace signs the new bytes" in err
    assert (
        run(capsys, "push", "--replace", "--key", str(keys), *FACTS, str(local.path), url)[0] == 0
    )


def test_the_ci_bake_journey_replaces_re_profiled_plans(tmp_path: Path, keys: Path) -> None:
    import os
    import subprocess
    import sys

    local = signed_dir(tmp_path / "plans", keys, FP)
    local.write(FP, plan_bytes(kv=21 * 2**30), local.read(FP)[1])
    env = {
        **os.environ,
        "PLANCACHE": f"{sys.executable} -m plancache.cli.main",
        "PLANCACHE_URL": (tmp_path / "s").as_uri(),
        "PLANCACHE_SIGNING_KEY": str(keys),
        "IMAGE_PLAN_DIR": str(tmp_path / "image"),
        "PLAN_DIR": str(local.path),
        "PLANCACHE_FACTS": "gpu_memory_utilization=0.9 device_name=x "
        "device_total_memory=85899345920",
    }
    journey = Path(__file__).resolve().parents[1] / "src" / "plancache" / "journeys" / "ci-bake.sh"

    def bake(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(journey), *args], env=env, capture_output=True, text=True, timeout=120
        )

    refused = bake()
    assert refused.returncode == 1 and "digest-mismatch" in refused.stdout + refused.stderr
    replaced = bake("--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert LocalPlanDir(tmp_path / "image").read(FP)[0] == plan_bytes(kv=21 * 2**30)
    assert (
        "--replace"
        in subprocess.run(["bash", str(journey), "--help"], capture_output=True, text=True).stdout
    )


def test_an_unknown_fact_lists_the_known_ones(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, keys: Path
) -> None:
    local = LocalPlanDir(tmp_path / "plans")
    local.write(FP, plan_bytes(), None)
    code, _, err = run(
        capsys, "sign", "--key", str(keys), "--fact", "gpu_memory_utilisation=0.9", str(local.path)
    )
    assert (
        code == 2
        and "unknown --fact 'gpu_memory_utilisation'; did you mean 'gpu_memory_utilization'?" in err
    )
    assert "known facts:" in err and "device_total_memory" in err and local.read(FP)[1] is None


# -- what JSON and tables say (items 4 and 5) -----------------------------------------------------

SIGNED_FACTS = {
    "gpu_memory_utilization": 0.9,
    "device_name": "x",
    "device_total_memory": 85899345920,
}


def _schema_validator():
    from importlib import resources

    import jsonschema

    schema = json.loads(resources.files("plancache.cli").joinpath("report.schema.json").read_text())
    return jsonschema.Draft202012Validator(schema)


def test_verify_ls_and_pull_json_carry_the_signed_provenance_facts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, keys: Path, s3: MotoServer
) -> None:
    url = pushed_plan(capsys, tmp_path, keys, s3)
    trusted = ("--trusted-keys", f"{keys}.pub")
    for argv in (
        ("verify", *trusted, url),
        ("ls", *trusted, url),
        ("ls", url),
        ("pull", *trusted, url, str(tmp_path / "node")),
    ):
        code, out, _ = run(capsys, argv[0], "--json", *argv[1:])
        doc = json.loads(out)
        _schema_validator().validate(doc)
        (plan,) = doc["plans"]
        assert code == 0 and plan["provenance"] == SIGNED_FACTS, argv
        assert plan["outcome"] == ("unverified" if argv == ("ls", url) else "valid")


def test_the_pull_table_says_missing_store_error_and_timeout_apart(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, keys: Path, s3: MotoServer
) -> None:
    import socket

    from store_servers import closed_port

    url = pushed_plan(capsys, tmp_path, keys, s3)
    # 30 s where the outcome is the point, not the budget: a loaded machine cannot turn a miss or
    # a refusal into a timeout (the black hole's 1 s below is the timeout)
    trusted = ("--trusted-keys", f"{keys}.pub", "--timeout", "30")
    code, out, err = run(
        capsys, "pull", *trusted, "--fingerprint", "0123456789abcdee", url, str(tmp_path / "n")
    )
    assert code == 1 and out.splitlines()[1].split()[1] == "missing" and "1 not in the store" in err
    code, out, _ = run(
        capsys,
        "pull",
        "--json",
        *trusted,
        "--fingerprint",
        "0123456789abcdee",
        url,
        str(tmp_path / "n"),
    )
    (plan,) = json.loads(out)["plans"]
    # status keeps its shipped value
    assert plan["status"] == "invalid" and plan["outcome"] == "missing"
    refused = f"http://127.0.0.1:{closed_port()}"
    code, out, err = run(
        capsys,
        "pull",
        *trusted,
        "--fingerprint",
        FP,
        "--storage-option",
        f"endpoint_url={refused}",
        url,
        str(tmp_path / "n"),
    )
    assert (
        code == 2
        and out.splitlines()[1].split()[1] == "store-error"
        and "1 could not be read" in err
    )
    with socket.socket() as hole:  # accepts connections, never answers
        hole.bind(("127.0.0.1", 0))
        hole.listen(16)
        code, out, _ = run(
            capsys,
            "pull",
            *trusted[:2],
            "--fingerprint",
            FP,
            "--timeout",
            "1",
            "--storage-option",
            f"endpoint_url=http://127.0.0.1:{hole.getsockname()[1]}",
            url,
            str(tmp_path / "n"),
        )
    assert code == 2 and out.splitlines()[1].split()[1] == "timeout"


def test_sign_takes_quiet(capsys: pytest.CaptureFixture[str], tmp_path: Path, keys: Path) -> None:
    local = LocalPlanDir(tmp_path / "plans")
    local.write(FP, plan_bytes(), None)
    code, out, err = run(capsys, "sign", "-q", "--key", str(keys), *FACTS, str(local.path))
    assert code == 0 and "signed" in out and err == ""


def test_push_dry_run_says_what_would_happen(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, keys: Path
) -> None:
    signed_dir(tmp_path / "plans", keys, FP, "fedcba9876543210")
    url = (tmp_path / "store").as_uri()
    code, out, _ = run(capsys, "push", "--dry-run", str(tmp_path / "plans"), url)
    assert (
        code == 0
        and "would upload" in out
        and "would be" not in out.split("\n", 1)[1].rsplit("\n", 2)[0]
    )
    assert run(capsys, "push", str(tmp_path / "plans"), url)[0] == 0
    code, out, _ = run(capsys, "push", "--dry-run", str(tmp_path / "plans"), url)
    assert (
        "already in the store" in out and "would be unchanged" not in out and "unchanged" not in out
    )


def test_doctor_says_invalid_for_an_invalid_url(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLANCACHE_URL", "not-a-url")
    _, out, _ = run(capsys, "doctor", "--json")
    (store,) = [c for c in json.loads(out)["checks"] if c["name"] == "store"]
    assert (
        "invalid" in store["detail"]
        and "unset" not in store["detail"]
        and store["status"] == "fail"
    )


# -- boot-sized budgets (item 6) ------------------------------------------------------------------


def test_a_whole_store_pull_on_a_boot_path_has_a_boot_sized_budget(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, keys: Path
) -> None:
    from plancache.settings import BOOT_TIMEOUT, BULK_TIMEOUT, DEFAULT_TIMEOUT

    signed_dir(tmp_path / "plans", keys, FP)
    url = (tmp_path / "store").as_uri()
    assert run(capsys, "push", str(tmp_path / "plans"), url)[0] == 0
    budgets = {}
    for extra in ((), ("--boot",), ("--boot", "--fingerprint", FP), ("--boot", "--timeout", "4")):
        _code, out, _ = run(
            capsys,
            "pull",
            "--json",
            "--trusted-keys",
            f"{keys}.pub",
            *extra,
            url,
            str(tmp_path / "n"),
        )
        _schema_validator().validate(json.loads(out))
        budgets[extra] = json.loads(out)["budget_seconds"]
    assert budgets == {
        (): BULK_TIMEOUT,
        ("--boot",): BOOT_TIMEOUT,
        ("--boot", "--fingerprint", FP): DEFAULT_TIMEOUT,
        ("--boot", "--timeout", "4"): 4,
    }
    assert BOOT_TIMEOUT <= 15 < BULK_TIMEOUT


def test_the_spot_boot_journey_pulls_with_the_boot_defaults(tmp_path: Path) -> None:
    import os
    import subprocess

    calls = tmp_path / "calls"
    stub = tmp_path / "plancache-stub"
    stub.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    stub.chmod(0o755)
    journey = (
        Path(__file__).resolve().parents[1] / "src" / "plancache" / "journeys" / "spot-boot.sh"
    )
    env = {
        **os.environ,
        "PLANCACHE": str(stub),
        "PLANCACHE_URL": "s3://b/p",
        "PLANCACHE_TRUSTED_KEYS": "k.pub",
    }
    env.pop("PLANCACHE_TIMEOUT", None)
    for args in ((), (FP,)):
        assert (
            subprocess.run(
                ["bash", str(journey), *args], env=env, capture_output=True, timeout=60
            ).returncode
            == 0
        )
    assert calls.read_text().splitlines() == [
        "pull --boot s3://b/p",
        f"pull --boot --fingerprint {FP} s3://b/p",
    ]


# -- conveniences (item 8) ------------------------------------------------------------------------


def test_s3_flags_reach_the_store_as_storage_options(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    keys: Path,
    s3: MotoServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = pushed_plan(capsys, tmp_path, keys, s3)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    (tmp_path / "aws-config").write_text("[profile plans]\nregion = eu-west-1\n")
    (tmp_path / "aws-credentials").write_text(
        f"[plans]\naws_access_key_id = {AWS_ENV['AWS_ACCESS_KEY_ID']}\n"
        f"aws_secret_access_key = {AWS_ENV['AWS_SECRET_ACCESS_KEY']}\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    trusted = ("--trusted-keys", f"{keys}.pub")
    for extra in (("--profile", "plans"), ("--profile", "plans", "--region", "us-east-1")):
        code, out, err = run(
            capsys, "verify", "--json", *trusted, "--endpoint-url", s3.endpoint, *extra, url
        )
        assert code == 0 and json.loads(out)["plans"][0]["status"] == "valid", err
        code, _, err = run(
            capsys,
            "pull",
            *trusted,
            "--endpoint-url",
            s3.endpoint,
            *extra,
            "--fingerprint",
            FP,
            url,
            str(tmp_path / "node"),
        )
        assert code == 0, err
    # without the endpoint the store is AWS itself: the flag, not the environment, pointed at moto
    code, _, err = run(capsys, "ls", "--profile", "nobody", "--endpoint-url", s3.endpoint, url)
    assert code == 2 and "nobody" in err
    code, _, err = run(capsys, "ls", "--region", "eu-west-1", str(tmp_path / "plans"))
    assert code == 2 and "--region is for s3:// URLs" in err


def test_debug_is_plancache_debug_before_or_after_the_command(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import plancache.cli.plans.offline as offline

    def broken(args: object) -> int:
        raise RuntimeError("a bug")

    monkeypatch.delenv("PLANCACHE_DEBUG", raising=False)
    monkeypatch.setattr(offline, "cmd_ls", broken)
    code, _, err = run(capsys, "ls", str(tmp_path))
    assert code == 2 and "Traceback" not in err and "PLANCACHE_DEBUG=1" in err
    for argv in (("--debug", "ls", str(tmp_path)), ("ls", "--debug", str(tmp_path))):
        monkeypatch.delenv("PLANCACHE_DEBUG", raising=False)
        code, _, err = run(capsys, *argv)
        assert code == 2 and "Traceback" in err and "RuntimeError: a bug" in err


def test_verify_fingerprint_checks_only_those_plans(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, keys: Path, s3: MotoServer
) -> None:
    other = "fedcba9876543210"
    local = signed_dir(tmp_path / "plans", keys, FP, other)
    # tampered, but not asked about
    local.write(other, plan_bytes(fp=other, kv=3), local.read(other)[1])
    url = f"s3://{s3.new_bucket()}/team"
    assert run(capsys, "push", str(local.path), url)[0] == 0
    trusted = ("--trusted-keys", f"{keys}.pub")
    for where in (str(local.path), url):
        code, out, _ = run(capsys, "verify", "--json", *trusted, "--fingerprint", FP, where)
        assert code == 0 and [p["fingerprint"] for p in json.loads(out)["plans"]] == [FP]
        code, out, _ = run(
            capsys,
            "verify",
            "--json",
            *trusted,
            "--fingerprint",
            FP,
            "--fingerprint",
            "0123456789abcdee",
            where,
        )
        plans = {p["fingerprint"]: p["outcome"] for p in json.loads(out)["plans"]}
        assert code == 1 and plans == {FP: "valid", "0123456789abcdee": "missing"}
    code, _, err = run(capsys, "verify", *trusted, "--fingerprint", FP, "s3://no-such-bucket/x")
    assert code == 2 and "does not exist" in err
    code, _, err = run(capsys, "verify", *trusted, "--fingerprint", "nothex", str(local.path))
    assert code == 2 and "not a plan fingerprint" in err


def test_a_near_miss_prefix_names_the_one_meant(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, keys: Path, s3: MotoServer
) -> None:
    signed_dir(tmp_path / "llama" / "h100", keys, FP)
    (tmp_path / "llama" / "h10").mkdir()
    url = f"s3://{s3.new_bucket()}/team/llama"
    assert run(capsys, "push", str(tmp_path / "llama" / "h100"), f"{url}/h100")[0] == 0
    assert run(capsys, "push", str(tmp_path / "llama" / "h100"), f"{url}/a100-80gb")[0] == 0
    trusted = ("--trusted-keys", f"{keys}.pub")
    code, _, err = run(capsys, "verify", *trusted, f"{url}/h10")
    assert code == 1 and f"did you mean {url}/h100 (it holds plans)?" in err
    code, _, err = run(capsys, "verify", *trusted, str(tmp_path / "llama" / "h10"))
    assert code == 1 and f"did you mean {tmp_path / 'llama' / 'h100'} (it holds plans)?" in err
    code, _, err = run(capsys, "ls", f"{url}/zzz")
    assert "did you mean" not in err  # nothing near: no guess


def test_completion_prints_argcompletes_code_for_bash_and_zsh(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("argcomplete", reason="the [completion] extra (in [test]) is not installed")
    code, out, _ = run(capsys, "completion", "zsh")
    assert code == 0 and out.startswith("#compdef plancache")
    code, out, _ = run(capsys, "completion", "bash")
    assert (
        code == 0
        and "complete -o nospace -o default -o bashdefault -F _python_argcomplete plancache" in out
    )
    assert run(capsys, "completion", "fish")[0] == 2


def _completions(shell: str, tmp_path: Path, line: str) -> str:
    import os
    import shutil
    import subprocess
    import sys

    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    pytest.importorskip("argcomplete", reason="the [completion] extra (in [test]) is not installed")
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "plancache").write_text(
        f'#!/bin/sh\nexec {sys.executable} -m plancache.cli.main "$@"\n'
    )
    (bindir / "plancache").chmod(0o755)
    words = line.split(" ")
    if shell == "bash":
        script = (
            f'eval "$(plancache completion bash)"; COMP_LINE="{line}"; COMP_POINT=${{#COMP_LINE}}; '
            f"COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
            f'_python_argcomplete plancache {words[-1]} {words[-2]}; echo "${{COMPREPLY[*]}}"'
        )
    else:  # zsh: argcomplete's zsh function, called as compsys would, with compadd recorded
        script = (
            'autoload -U compinit && compinit -u -D; eval "$(plancache completion zsh)"; '
            '_describe() { print -rl -- "${completions[@]}"; }; '
            f'words=({line}); CURRENT={len(words)}; BUFFER="{line}"; CURSOR=${{#BUFFER}}; '
            "_python_argcomplete plancache"
        )
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path)}
    done = subprocess.run(
        [shell, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    return done.stdout + done.stderr


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_the_shell_completes_commands_and_options(shell: str, tmp_path: Path) -> None:
    assert "verify" in _completions(shell, tmp_path, "plancache ver")
    assert "--trusted-keys" in _completions(shell, tmp_path, "plancache verify --trus")


def test_a_near_miss_named_by_a_hostile_store_is_shown_escaped(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, keys: Path
) -> None:
    hostile = "h100\x1b[2J\u202e"
    signed_dir(tmp_path / "llama" / hostile, keys, FP)
    (tmp_path / "llama" / "h100").mkdir()
    code, _, err = run(
        capsys, "verify", "--trusted-keys", f"{keys}.pub", (tmp_path / "llama" / "h100").as_uri()
    )
    assert code == 1 and "did you mean" in err and "\\x1b[2J\\u202e" in err
    assert "\x1b" not in err and "\u202e" not in err
