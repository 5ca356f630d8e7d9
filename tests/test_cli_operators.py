"""Issue 11 as a platform engineer meets it, against moto's S3 server and local directories:
audits that cannot pass by typo, bulk work that says what it would do and re-reads before it
deletes, messages that name the mistake, progress in plans, and a lean boot-time pull."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_support import (
    keys,  # noqa: F401 - a fixture, named as a parameter
    run,
    s3,  # noqa: F401 - a fixture, named as a parameter
)
from conftest import FP, GIB, plan_bytes
from plancache.cli.main import main
from plancache.cli.output import Progress
from plancache.keys.keyfile import generate_keypair
from plancache.storage.conditional_deletes import content_digest, delete_if_unchanged
from plancache.storage.local.localdir import LocalPlanDir
from plancache.storage.store import open_store
from plancache.trust.plans.plan import plan_name, sig_name
from store_servers import (
    MotoServer,
    moto_server,  # noqa: F401 - a fixture, named as a parameter
)

FP2 = "fedcba9876543210"
FP3 = "00000000deadbeef"


def signed_dir(path: Path, key: Path, *fps: str) -> LocalPlanDir:
    local = LocalPlanDir(path)
    for fp in fps:
        local.write(fp, plan_bytes(fp=fp), None)
    assert (
        main(
            [
                "sign",
                "--key",
                str(key),
                "--fact",
                "gpu_memory_utilization=0.9",
                "--fact",
                "device_name=x",
                "--fact",
                "device_total_memory=85899345920",
                str(path),
            ]
        )
        == 0
    )
    return local


# -- locations ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["verify", "ls", "pull", "prune"])
def test_a_missing_bucket_is_exit_2_for_every_command(
    s3: MotoServer, keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    extra = {"verify": [], "ls": [], "pull": [], "prune": ["--older-than", "1d"]}[command]
    argv = [command, *extra, "--trusted-keys", f"{keys}.pub", "s3://no-such-bucket/x"]
    if command == "pull":
        argv.append(str(tmp_path / "dir"))
    code, out, err = run(capsys, *argv)
    assert (
        code == 2
        and "bucket 'no-such-bucket' does not exist" in err
        and len(err.strip().splitlines()) == 1
    )
    assert out == ""


def test_empty_prefix_fails_verify_and_names_deeper_prefixes(
    s3: MotoServer, keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = s3.new_bucket()
    signed = signed_dir(tmp_path / "ci-plans", keys, FP)
    assert run(capsys, "push", str(signed.path), f"s3://{bucket}/team/llama/h100")[0] == 0
    code, _, err = run(capsys, "verify", "--trusted-keys", f"{keys}.pub", f"s3://{bucket}/team")
    assert code == 1 and "no plans in s3://" in err and f"s3://{bucket}/team/llama/h100" in err
    code, _, err = run(
        capsys, "verify", "--allow-empty", "--trusted-keys", f"{keys}.pub", f"s3://{bucket}/nothing"
    )
    assert code == 0 and "no plans" in err
    code, _, err = run(
        capsys, "verify", "--trusted-keys", f"{keys}.pub", f"S3://{bucket}/team/llama/h100"
    )
    assert code == 0, err  # the scheme's case is normalised
    # the same for a local directory: the plans are one level down
    code, _, err = run(capsys, "verify", "--trusted-keys", f"{keys}.pub", str(tmp_path))
    assert code == 1 and str(signed.path) in err


def test_messages_name_the_mistake(
    s3: MotoServer, keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(
        capsys, "ls", "--storage-option", "endpoint-url=http://127.0.0.1:1", "s3://b/x"
    )
    assert (
        code == 2
        and "unknown storage option 'endpoint-url' for s3://" in err
        and "'endpoint_url'" in err
    )
    signed = signed_dir(tmp_path / "plans", keys, FP)
    code, _, err = run(
        capsys, "verify", "--trusted-keys", f"{keys}.pub", str(signed.path / plan_name(FP))
    )
    assert code == 2 and "is a file" in err and "plancache inspect" in err
    LocalPlanDir(signed.path).write(FP2, plan_bytes(fp=FP2), None)
    code, out, _ = run(capsys, "ls", "--trusted-keys", f"{keys}.pub", str(signed.path))
    assert "unsigned (unsigned)" not in out and "unsigned" in out
    code, out, _ = run(capsys, "inspect", str(signed.path / sig_name(FP)))
    assert (
        code == 0
        and not any(c in out for c in "{}[]'")
        and "statement.provenance.gpu_memory_utilization" in out
    )
    code, out, _ = run(capsys)
    assert code == 0 and "usage: plancache" in out and "doctor" in out


@pytest.mark.parametrize("command", ["ls", "verify"])
def test_a_fifo_named_as_a_file_store_is_exit_2_without_blocking(
    command: str, keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ls file:///FIFO`` said "no plans" and exited 0, as for an empty directory: a FIFO (or
    socket, or device) where the store's directory should be is a configuration error, looked up
    and never opened (an open would block until a writer came)."""
    fifo = tmp_path / "plans"
    os.mkfifo(fifo)
    code, out, err = run(capsys, command, "--trusted-keys", f"{keys}.pub", fifo.as_uri())
    assert (
        code == 2 and err.count("\n") == 1 and "is not a directory of plans" in err and out == ""
    ), err


# -- bulk ------------------------------------------------------------------------------------------


def test_push_dry_run_and_fingerprints(
    s3: MotoServer, keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"s3://{s3.new_bucket()}/plans"
    local = LocalPlanDir(tmp_path / "plans")
    for fp in (FP, FP2, FP3):
        local.write(fp, plan_bytes(fp=fp), None)
    code, out, _ = run(
        capsys, "push", "--json", "--dry-run", "--key", str(keys), str(local.path), url
    )
    doc = json.loads(out)
    assert code == 0 and doc["uploaded"] == 3 and doc["objects_uploaded"] == 6
    assert {p["detail"] for p in doc["plans"]} == {"signed first"}
    assert not any(p.name.endswith(".sig") for p in local.path.iterdir())  # nothing signed locally
    assert s3.client().list_objects_v2(Bucket=url[5:].split("/")[0]).get("KeyCount", 0) == 0
    code, out, _ = run(
        capsys, "push", "--json", "--key", str(keys), "--fingerprint", FP2, str(local.path), url
    )
    assert code == 0 and [p["fingerprint"] for p in json.loads(out)["plans"]] == [FP2]
    assert open_store(url, None, 30).fingerprints() == [FP2]
    code, out, _ = run(
        capsys, "push", "--json", "--fingerprint", "aaaaaaaaaaaaaaaa", str(local.path), url
    )
    assert code == 1 and json.loads(out)["plans"][0]["action"] == "refused"


def test_push_reports_its_plans_in_fingerprint_order(
    keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As verify and ls do: a push of a whole directory lists its plans sorted, not in the order
    of a set of str (which changed with each run's hash seed)."""
    local = LocalPlanDir(tmp_path / "plans")
    fps = [f"{i * 7919:016x}" for i in range(20)]
    for fp in fps:
        local.write(fp, plan_bytes(fp=fp), None)
    url = (tmp_path / "store").as_uri()
    code, out, _ = run(
        capsys, "push", "--json", "--dry-run", "--key", str(keys), str(local.path), url
    )
    assert code == 0 and [p["fingerprint"] for p in json.loads(out)["plans"]] == sorted(fps)


def test_prune_unsigned_invalid_and_only_what_it_judged(
    s3: MotoServer, keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"s3://{s3.new_bucket()}/plans"
    signed = signed_dir(tmp_path / "signed", keys, FP, FP2)
    assert run(capsys, "push", str(signed.path), url)[0] == 0
    store = open_store(url, None, 30)
    store.put(FP3, plan_bytes(fp=FP3), None)  # unsigned
    code, out, _ = run(capsys, "prune", "--unsigned", "--json", url)
    assert code == 0 and [d["fingerprint"] for d in json.loads(out)["deleted"]] == [FP3]
    assert store.fingerprints() == [FP, FP2]

    store.open_backend().fs.pipe_file(
        store.path(plan_name(FP2)), plan_bytes(fp=FP2, kv=2 * GIB)
    )  # tampered
    other = tmp_path / "other"
    generate_keypair(other, force=False, comment="other")
    code, _, err = run(capsys, "prune", "--invalid", "--trusted-keys", f"{other}.pub", url)
    # wrong keys: refused
    assert code == 2 and "check --trusted-keys" in err and store.fingerprints() == [FP, FP2]
    code, out, _ = run(
        capsys, "prune", "--invalid", "--dry-run", "--json", "--trusted-keys", f"{keys}.pub", url
    )
    assert [(d["fingerprint"], d["why"]) for d in json.loads(out)["deleted"]] == [
        (FP2, "digest-mismatch")
    ]
    assert store.fingerprints() == [FP, FP2]
    code, out, _ = run(capsys, "prune", "--invalid", "--trusted-keys", f"{keys}.pub", url)
    assert code == 0 and store.fingerprints() == [FP]

    # judged, then re-pushed before the delete: kept
    judged = store.fetch(FP)
    store.open_backend().fs.pipe_file(store.path(plan_name(FP)), plan_bytes(kv=3 * GIB))
    deleted, changed = delete_if_unchanged(
        store, {FP: content_digest(judged.plan_bytes, judged.sig_bytes)}
    )
    assert deleted == [] and changed == [FP] and store.fingerprints() == [FP]
    deleted, _ = delete_if_unchanged(
        store, {FP: content_digest(plan_bytes(kv=3 * GIB), judged.sig_bytes)}
    )
    assert deleted == [FP] and store.fingerprints() == []


def test_sign_warns_without_the_gate_conditions(
    keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local = LocalPlanDir(tmp_path / "plans")
    local.write(FP, plan_bytes(), None)
    code, _, err = run(capsys, "sign", "--key", str(keys), str(local.path))
    assert (
        code == 0
        and "warning: signed without gpu_memory_utilization, device_name, device_total_memory"
        in err
    )
    other = LocalPlanDir(tmp_path / "other")
    other.write(FP2, plan_bytes(fp=FP2), None)
    code, _, err = run(
        capsys,
        "sign",
        "--key",
        str(keys),
        "--fact",
        "gpu_memory_utilization=0.9",
        "--fact",
        "device_name=H100",
        "--fact",
        "device_total_memory=85899345920",
        str(other.path),
    )
    assert code == 0 and "warning" not in err
    third = LocalPlanDir(tmp_path / "third")
    third.write(FP2, plan_bytes(fp=FP2), None)
    code, _, err = run(
        capsys,
        "sign",
        "--key",
        str(keys),
        "--fact",
        "gpu_memory_utilization=0.9",
        "--fact",
        "device_name=H100",
        str(third.path),
    )
    assert code == 0 and "signed without device_total_memory:" in err
    # the hint names only what is missing
    assert "(record them: --fact device_total_memory=BYTES)" in err


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_counts_plans_with_rate_and_eta() -> None:
    stream = Terminal()
    with Progress("pull", stream=stream) as bar:
        bar.start(4)
        for _ in range(8):
            bar.advance(0.5)  # a plan is two objects
        bar._bar.refresh()
        shown = stream.getvalue()
    # count, rate, elapsed<remaining
    assert "4/4 plans" in shown and "plan/s" in shown and "<" in shown
    quiet = Terminal()
    with Progress("pull", quiet=True, stream=quiet) as bar:
        bar.start(4)
        bar.advance(4)
    assert quiet.getvalue() == ""


def test_pull_imports_only_what_it_uses(tmp_path: Path, keys: Path) -> None:
    """A boot-time pull with keys: no did-you-mean machinery (difflib) when the command parsed,
    no keyless verifier when no identity is trusted, no SSH serialization (bcrypt, ciphers) for
    ssh-ed25519 lines (issue 50 item 7 (c))."""
    signed = signed_dir(tmp_path / "ci-plans", keys, FP)
    url = (tmp_path / "bucket").as_uri()
    assert main(["push", str(signed.path), url]) == 0
    code = (
        "import sys; from plancache.cli.main import main; "
        f"rc = main(['pull', '--trusted-keys', {str(keys) + '.pub'!r}, '--fingerprint', {FP!r}, "
        f"{url!r}, {str(tmp_path / 'node')!r}]); "
        "print(rc, sorted(m for m in ('multiprocessing', 'plancache.cli.demo', "
        "'plancache.pipeline.bulk', 'plancache.cli.plans.offline', "
        "'plancache.pipeline.directory_signing', 'tqdm', 'jsonschema', "
        "'concurrent.futures.process', 'difflib', 'plancache.trust.keyless.sigstore_bundle', "
        "'plancache.trust.keyless.dsse_extension', 'plancache.trust.keyless.trust_root', "
        "'bcrypt', 'cryptography.hazmat.primitives.serialization') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.stdout.strip().splitlines()[-1] == "0 []", done.stdout + done.stderr


def test_verify_of_a_directory_imports_no_store_machinery(tmp_path: Path, keys: Path) -> None:
    """An offline audit of a directory needs no event loop, no fsspec and no SDK (asyncio alone
    was 45 ms of a 10k-plan ``verify``, through the parser's default-timeout constant)."""
    signed = signed_dir(tmp_path / "ci-plans", keys, FP)
    code = (
        "import sys; from plancache.cli.main import main; "
        f"rc = main(['verify', '--trusted-keys', {str(keys) + '.pub'!r}, {str(signed.path)!r}]); "
        "print(rc, sorted(m for m in ('asyncio', 'fsspec', 'botocore', 'aiohttp', "
        "'plancache.storage.store', 'plancache.storage.deadline') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.stdout.strip().splitlines()[-1] == "0 []", done.stdout + done.stderr


# -- doctor ----------------------------------------------------------------------------------------


def test_doctor_explains_a_worker(
    s3: MotoServer,
    keys: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in (
        "VLLM_PLUGINS",
        "PLANCACHE_URL",
        "PLANCACHE_SIGNING_KEY",
        "PLANCACHE_STORAGE_OPTIONS",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    signed_dir(tmp_path / "vllm" / "startup_plan", keys, FP)  # baseline 70 GiB
    capsys.readouterr()
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", f"{keys}.pub")
    monkeypatch.setenv("VLLM_ENABLE_STARTUP_PLAN", "1")
    monkeypatch.setenv("PLANCACHE_TIMEOUT", "30")  # what the store says, not when: room for load

    def checks(*argv: str) -> tuple[int, dict[str, dict[str, object]]]:
        code, out, _ = run(capsys, "doctor", "--json", *argv)
        return code, {c["name"]: c for c in json.loads(out)["checks"]}

    code, found = checks("--free-memory", "80GiB")
    assert code == 0 and found["trusted-keys"]["data"]["names"] == ["ci"]
    assert found["local-plans"]["data"]["plans"][0]["decision"] == "apply"
    code, found = checks("--free-memory", "60GiB")
    assert code == 1 and found["local-plans"]["data"]["plans"][0]["reason"] == "below-baseline"
    monkeypatch.setenv("PLANCACHE_URL", "s3://no-such-bucket/plans")
    code, found = checks("--free-memory", "60GiB")
    assert (
        code == 1
        and found["store"]["status"] == "fail"
        and "does not exist" in found["store"]["detail"]
    )
    monkeypatch.setenv("PLANCACHE_URL", f"s3://{s3.new_bucket()}/plans")
    code, found = checks("--free-memory", "60GiB")
    assert (
        code == 0
        and found["store"]["status"] == "warn"
        and found["local-plans"]["status"] == "warn"
    )
    monkeypatch.setenv("VLLM_PLUGINS", "some_other_plugin")
    monkeypatch.setenv("VLLM_ENABLE_STARTUP_PLAN", "0")
    code, out, err = run(capsys, "doctor")
    assert code == 1 and "vllm-plugins" in out and "FAIL" in out and "will not apply" in err
    with pytest.raises(SystemExit) as usage:
        main(["doctor", "--free-memory", "lots"])
    assert usage.value.code == 2 and "not a byte count" in capsys.readouterr().err


def test_doctor_does_not_import_vllm(tmp_path: Path) -> None:
    code = (
        "import sys; from plancache.cli.main import main; rc = main(['doctor', '--json']); "
        "print(rc, [m for m in ('vllm', 'torch') if m in sys.modules], file=sys.stderr)"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "VLLM_CACHE_ROOT": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.stderr.strip().splitlines()[-1].endswith(" []"), done.stderr
    assert json.loads(done.stdout)["command"] == "doctor"


@pytest.mark.parametrize(
    "argv",
    [
        ["sign", "--expires-in", "99999999999d"],
        ["prune", "--older-than", "999999999999w", "file:///nowhere"],
    ],
)
def test_out_of_range_durations_are_one_line_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "longer than 100 years" in err


@pytest.mark.parametrize("budget", ["0", "inf", "nan", "-1", "1e9"])
def test_budgets_that_are_no_budget_are_one_line_errors(
    budget: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    generate_keypair(tmp_path / "k", force=False, comment="k")
    for argv in (
        ["pull", "--trusted-keys", f"{tmp_path / 'k'}.pub", "--fingerprint", FP],
        ["pull", "--trusted-keys", f"{tmp_path / 'k'}.pub"],
        ["ls"],
    ):
        code = main([*argv, "--timeout", budget, (tmp_path / "bucket").as_uri()])
        err = capsys.readouterr().err
        assert (
            code == 2
            and err.startswith("plancache: error: the timeout")
            and len(err.splitlines()) == 1
        ), (argv, err)


def test_absurd_jobs_still_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    generate_keypair(tmp_path / "k", force=False, comment="k")
    local = LocalPlanDir(tmp_path / "plans")
    for i in range(250):  # enough for the process pool
        local.write(f"{i:016x}", plan_bytes(f"{i:016x}"), None, sync=False)
    assert main(["sign", "--key", str(tmp_path / "k"), str(local.path)]) == 0
    assert (
        main(
            [
                "verify",
                "--jobs",
                "99999999999",
                "--trusted-keys",
                f"{tmp_path / 'k'}.pub",
                str(local.path),
            ]
        )
        == 0
    )
