"""The three journey scripts in scripts/, run as a user runs them, against file:// and S3.

The S3 runs reach moto's server through ``AWS_ENDPOINT_URL`` alone, which botocore honours:
plancache passes the environment through rather than inventing its own variables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FP, GIB, plan_bytes
from plancache.keys.keyfile import generate_keypair
from plancache.storage.local.localdir import LocalPlanDir
from plancache.storage.store import open_store
from plancache.trust.plans.plan import plan_name, sig_name
from store_servers import (
    AWS_ENV,
    BlackHole,
    MotoServer,
    black_hole,  # noqa: F401 - a fixture, named as a parameter
    moto_server,  # noqa: F401 - a fixture, named as a parameter
)

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
FP2 = "fedcba9876543210"


def script(
    name: str, env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """scripts/NAME (a thin caller of the packaged journey), with this interpreter's plancache."""
    full = {**os.environ, "PLANCACHE": f"{sys.executable} -m plancache.cli.main", **env}
    return subprocess.run(
        ["bash", str(SCRIPTS / name), *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(params=["file", "s3"])
def store_env(
    request: pytest.FixtureRequest, tmp_path: Path
) -> tuple[str, dict[str, str], dict[str, object]]:
    """(store URL, environment for the scripts, storage options for test-side access)."""
    if request.param == "file":
        return (tmp_path / "bucket").as_uri(), {}, {}
    moto: MotoServer = request.getfixturevalue("moto_server")
    env = {**AWS_ENV, "AWS_ENDPOINT_URL": moto.endpoint}
    return f"s3://{moto.new_bucket()}/plans", env, moto.options


def test_three_journeys(
    store_env: tuple[str, dict[str, str], dict[str, object]], tmp_path: Path
) -> None:
    url, env, options = store_env
    generate_keypair(tmp_path / "ci-key", force=False, comment="ci")
    profiled = LocalPlanDir(tmp_path / "profiling" / "startup_plan")
    profiled.write(FP, plan_bytes(), None)
    profiled.write(FP2, plan_bytes(fp=FP2, kv=GIB, baseline=2 * GIB), None)
    image = tmp_path / "image" / "startup_plan"

    bake = script(
        "ci-bake.sh",
        {
            **env,
            "PLANCACHE_URL": url,
            "PLANCACHE_SIGNING_KEY": str(tmp_path / "ci-key"),
            "IMAGE_PLAN_DIR": str(image),
            "PLAN_DIR": str(profiled.path),
            "PLANCACHE_EXPIRES_IN": "30d",
            "PLANCACHE_FACTS": 'gpu_memory_utilization=0.9 "device_name=NVIDIA H100 80GB HBM3"',
        },
        "--fact",
        "device_total_memory=85899345920",
    )
    assert bake.returncode == 0, bake.stderr
    assert "warning" not in bake.stderr  # every gate condition recorded
    assert sorted(p.name for p in image.iterdir()) == sorted(
        [plan_name(FP), sig_name(FP), plan_name(FP2), sig_name(FP2)]
    )
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "plancache.cli.main",
            "inspect",
            "--json",
            str(image / sig_name(FP)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(shown.stdout)["statement"]["provenance"] == {
        "gpu_memory_utilization": 0.9,
        "device_name": "NVIDIA H100 80GB HBM3",
        "device_total_memory": 85899345920,
    }

    trusted = {"PLANCACHE_TRUSTED_KEYS": str(tmp_path / "ci-key.pub")}
    node = tmp_path / "node" / "vllm"
    boot = script(
        "spot-boot.sh",
        {
            **env,
            **trusted,
            "PLANCACHE_URL": url,
            "VLLM_CACHE_ROOT": str(node),
            "PLANCACHE_STRICT": "1",
        },
        FP,
    )
    assert boot.returncode == 0, boot.stderr
    assert sorted(p.name for p in (node / "startup_plan").iterdir()) == [
        plan_name(FP),
        sig_name(FP),
    ]

    audit_json = tmp_path / "audit.json"
    audit = script("offline-audit.sh", {**env, **trusted, "AUDIT_JSON": str(audit_json)}, url)
    assert audit.returncode == 0, audit.stderr
    assert FP in audit.stdout and json.loads(audit_json.read_text())["ok"] is True

    # someone rewrites a plan in the bucket: the audit fails, a spot boot keeps going without it
    store = open_store(url, options, 30)
    store.open_backend().fs.pipe_file(
        store.path(plan_name(FP2)), plan_bytes(fp=FP2, kv=2 * GIB - 1, baseline=2 * GIB)
    )
    audit = script(
        "offline-audit.sh", {**env, **trusted, "PLANCACHE_URL": url, "AUDIT_JSON": str(audit_json)}
    )
    assert audit.returncode == 1 and "digest-mismatch" in audit.stdout
    failed = json.loads(audit_json.read_text())
    assert failed["ok"] is False and {p["reason"] for p in failed["plans"]} == {
        "ok",
        "digest-mismatch",
    }
    other = tmp_path / "other-node"
    boot = script(
        "spot-boot.sh",
        {
            **env,
            **trusted,
            "PLANCACHE_URL": url,
            "PLAN_DIR": str(other),
            "PLANCACHE_FINGERPRINTS": FP2,
        },
    )
    assert boot.returncode == 0 and "exited 1" in boot.stderr, boot.stdout + boot.stderr
    assert not other.exists() or list(other.iterdir()) == []
    strict = script(
        "spot-boot.sh",
        {**env, **trusted, "PLANCACHE_URL": url, "PLAN_DIR": str(other), "PLANCACHE_STRICT": "1"},
        FP2,
    )
    assert strict.returncode == 1


def test_offline_audit_never_leaves_a_stale_success(
    moto_server: MotoServer, tmp_path: Path
) -> None:
    """A mistyped bucket: exit 2, and the old green report is replaced by a failure report."""
    generate_keypair(tmp_path / "ci-key", force=False, comment="ci")
    report = tmp_path / "audit.json"
    report.write_text('{"ok": true, "plans": []}')
    env = {
        **AWS_ENV,
        "AWS_ENDPOINT_URL": moto_server.endpoint,
        "PLANCACHE_TRUSTED_KEYS": str(tmp_path / "ci-key.pub"),
        "AUDIT_JSON": str(report),
    }
    audit = script("offline-audit.sh", env, "s3://no-such-bucket/plans")
    assert audit.returncode == 2 and "does not exist" in audit.stderr and "ERROR" in audit.stderr
    doc = json.loads(report.read_text())
    assert (
        doc["ok"] is False
        and doc["error"]["reason"] == "config-error"
        and doc["schema"] == "plancache.report/v1"
    )
    assert [
        p.name
        for p in tmp_path.iterdir()
        if p.name.endswith(".tmp") or p.name.startswith(".audit.json")
    ] == []
    empty = script("offline-audit.sh", env, str(tmp_path))  # a directory without plans
    assert empty.returncode == 1 and json.loads(report.read_text())["error"]["reason"] == "no-plans"
    report.write_text("stale")
    # plancache cannot even run
    unusable = script("offline-audit.sh", {**env, "PLANCACHE": "false"}, "s3://b/p")
    assert unusable.returncode == 2 and json.loads(report.read_text())["ok"] is False


def test_spot_boot_tells_a_configuration_error_from_a_miss(
    moto_server: MotoServer, tmp_path: Path
) -> None:
    generate_keypair(tmp_path / "ci-key", force=False, comment="ci")
    env = {
        **AWS_ENV,
        "AWS_ENDPOINT_URL": moto_server.endpoint,
        "PLANCACHE_TRUSTED_KEYS": str(tmp_path / "ci-key.pub"),
        "PLAN_DIR": str(tmp_path / "plans"),
    }
    typo = script("spot-boot.sh", {**env, "PLANCACHE_URL": "s3://no-such-bucket/plans"}, FP)
    assert (
        typo.returncode == 0
        and "configuration error" in typo.stderr
        and "does not exist" in typo.stderr
    )
    strict = script(
        "spot-boot.sh",
        {**env, "PLANCACHE_URL": "s3://no-such-bucket/plans", "PLANCACHE_STRICT": "1"},
        FP,
    )
    assert strict.returncode == 2
    miss = script(
        "spot-boot.sh", {**env, "PLANCACHE_URL": f"s3://{moto_server.new_bucket()}/plans"}, FP
    )
    assert (
        miss.returncode == 0
        and "missing or was rejected" in miss.stderr
        and "configuration" not in miss.stderr
    )


def test_journeys_ship_in_the_wheel_and_run_from_a_plain_install(tmp_path: Path) -> None:
    """Build the wheel, install it (no deps) into a fresh venv that sees this one's packages,
    and run each journey from the venv's bin/ with a PATH that holds no plancache at all."""
    root = SCRIPTS.parent
    wheel_dir = tmp_path / "wheel"
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheel_dir),
            str(root),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    [wheel] = wheel_dir.glob("plancache-*.whl")
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    for packaged in (
        "plancache/journeys/ci-bake.sh",
        "plancache/journeys/spot-boot.sh",
        "plancache/journeys/offline-audit.sh",
        "plancache/cli/report.schema.json",
    ):
        assert packaged in names, packaged
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
    )
    installed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--no-deps",
            "--ignore-installed",
            "-q",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if installed.returncode != 0 and "no such option: --python" in installed.stderr:
        pytest.skip("pip too old for --python")
    assert installed.returncode == 0, installed.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PLANCACHE")}
    env["PATH"] = "/usr/bin:/bin"
    for name in ("ci-bake", "spot-boot", "offline-audit"):
        helped = subprocess.run(
            [str(venv / "bin" / f"plancache-{name}"), "--help"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert (
            helped.returncode == 0
            and f"plancache-{name}" in helped.stdout
            and "PLANCACHE_" in helped.stdout
        )
    audit = subprocess.run(
        [str(venv / "bin" / "plancache-offline-audit"), str(tmp_path / "nowhere")],
        capture_output=True,
        text=True,
        env={**env, "PLANCACHE_TRUSTED_KEYS": "/nonexistent"},
        timeout=60,
    )
    # ran the installed plancache
    assert audit.returncode == 2 and "plancache: error:" in audit.stderr


def test_scripts_explain_missing_settings(tmp_path: Path) -> None:
    for name in ("ci-bake.sh", "spot-boot.sh", "offline-audit.sh"):
        env = dict.fromkeys(
            ("PLANCACHE_URL", "PLANCACHE_TRUSTED_KEYS", "PLANCACHE_SIGNING_KEY"), ""
        )
        result = script(name, env)
        assert "PLANCACHE_" in result.stderr, (name, result.stderr)
        # a spot boot never blocks the boot (its init container) for a missing setting
        assert (result.returncode == 0) is (name == "spot-boot.sh"), (
            name,
            result.returncode,
            result.stderr,
        )


def test_spot_boot_with_nothing_configured_is_one_line_and_exit_0_unless_strict(
    tmp_path: Path,
) -> None:
    bare = dict.fromkeys(("PLANCACHE_URL", "PLANCACHE_TRUSTED_KEYS"), "")
    for missing, env in (
        ("PLANCACHE_URL", bare),
        ("PLANCACHE_TRUSTED_KEYS", {**bare, "PLANCACHE_URL": "s3://b/p"}),
    ):
        boot = script("spot-boot.sh", env)
        assert boot.returncode == 0 and boot.stdout == "", boot.stderr
        assert boot.stderr.strip().splitlines() == [
            f"spot-boot: {missing} is not set: no plan pulled; vLLM will profile"
        ]
        assert "parameter" not in boot.stderr
        assert script("spot-boot.sh", {**env, "PLANCACHE_STRICT": "1"}).returncode == 2


def test_offline_audit_replaces_its_report_when_keys_or_url_are_missing(tmp_path: Path) -> None:
    generate_keypair(tmp_path / "ci-key", force=False, comment="ci")
    plans = LocalPlanDir(tmp_path / "plans")
    plans.write(FP, plan_bytes(), None)
    report = tmp_path / "audit.json"
    for env, args in (
        ({"PLANCACHE_TRUSTED_KEYS": ""}, [str(plans.path)]),  # keys missing
        ({"PLANCACHE_TRUSTED_KEYS": str(tmp_path / "ci-key.pub"), "PLANCACHE_URL": ""}, []),  # URL
    ):
        report.write_text('{"ok": true, "plans": [], "schema": "plancache.report/v1"}')
        audit = script("offline-audit.sh", {**env, "AUDIT_JSON": str(report)}, *args)
        doc = json.loads(report.read_text())
        assert (
            audit.returncode == 2
            and doc["ok"] is False
            and doc["error"]["reason"] == "config-error"
        ), (audit.stderr, doc)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".audit.json")] == []
    (tmp_path / "elsewhere").write_text("keep\n")
    report.unlink()
    report.symlink_to(tmp_path / "elsewhere")  # never replaced through (or instead of) a link
    audit = script(
        "offline-audit.sh",
        {"PLANCACHE_TRUSTED_KEYS": str(tmp_path / "ci-key.pub"), "AUDIT_JSON": str(report)},
        str(plans.path),
    )
    assert (
        audit.returncode == 2
        and report.is_symlink()
        and (tmp_path / "elsewhere").read_text() == "keep\n"
    )


def _profiled(tmp_path: Path, *fps: str) -> LocalPlanDir:
    profiled = LocalPlanDir(tmp_path / "profiling" / "startup_plan")
    profiled.path.mkdir(parents=True, exist_ok=True)
    for fp in fps:
        profiled.write(fp, plan_bytes(fp=fp), None)
    return profiled


def test_ci_bake_fails_with_nothing_to_bake_unless_allowed(tmp_path: Path) -> None:
    generate_keypair(tmp_path / "ci-key", force=False, comment="ci")
    empty = _profiled(tmp_path)
    store = tmp_path / "store"
    env = {
        "PLANCACHE_URL": store.as_uri(),
        "PLANCACHE_SIGNING_KEY": str(tmp_path / "ci-key"),
        "IMAGE_PLAN_DIR": str(tmp_path / "image"),
        "PLAN_DIR": str(empty.path),
        "PLANCACHE_TRUSTED_KEYS": "",
    }
    bake = script("ci-bake.sh", env)
    assert bake.returncode == 1 and "no plans" in bake.stderr, bake.stderr
    assert not store.exists()  # nothing pushed
    store.mkdir()  # the store exists (a bucket); the bake has nothing for it, on purpose
    allowed = script("ci-bake.sh", env, "--allow-empty")
    assert allowed.returncode == 0, allowed.stderr


def test_ci_bake_takes_any_key_reference(tmp_path: Path) -> None:
    """An env:// key has no KEY.pub beside it: the bake asks plancache for its public key."""
    generate_keypair(tmp_path / "ci-key", force=False, comment="ci")
    profiled = _profiled(tmp_path, FP)
    image = tmp_path / "image"
    env = {
        "PLANCACHE_URL": (tmp_path / "store").as_uri(),
        "PLANCACHE_SIGNING_KEY": "env://CI_SIGNING_KEY",
        "CI_SIGNING_KEY": (tmp_path / "ci-key").read_text(),
        "IMAGE_PLAN_DIR": str(image),
        "PLAN_DIR": str(profiled.path),
        "PLANCACHE_TRUSTED_KEYS": "",
        "PLANCACHE_FACTS": "gpu_memory_utilization=0.9 device_name=x "
        "device_total_memory=85899345920",
    }
    bake = script("ci-bake.sh", env)
    assert bake.returncode == 0, bake.stderr
    assert sorted(p.name for p in image.iterdir()) == [plan_name(FP), sig_name(FP)]


def test_ci_bake_spends_the_documented_budget_on_an_unanswering_store(
    black_hole: BlackHole, tmp_path: Path
) -> None:
    """``PLANCACHE_TIMEOUT`` is the push's and the pull's budget (the CLI reads only
    ``--timeout``): a bake against a store that never answers ends with the CLI's own word that
    this budget ran out, not after the push's 120 s default. The budget is judged by what the CLI
    says it spent (no wall-clock assertion); the subprocess's limit only stops a run that
    ignores it."""
    generate_keypair(tmp_path / "ci-key", force=False, comment="ci")
    profiled = _profiled(tmp_path, FP)
    image = tmp_path / "image"
    bake = script(
        "ci-bake.sh",
        {
            **AWS_ENV,
            "PLANCACHE_URL": "s3://bucket/plans",
            "PLANCACHE_STORAGE_OPTIONS": f"endpoint_url={black_hole.endpoint}",
            "PLANCACHE_TIMEOUT": "1.5",
            "PLANCACHE_SIGNING_KEY": str(tmp_path / "ci-key"),
            "IMAGE_PLAN_DIR": str(image),
            "PLAN_DIR": str(profiled.path),
            "PLANCACHE_TRUSTED_KEYS": "",
        },
        timeout=60,
    )
    assert bake.returncode == 2, bake.stderr
    assert "no answer within the 1.5 s budget" in bake.stderr.splitlines()[-1], bake.stderr
    assert not image.exists()  # never reached the pull
    help_text = script("ci-bake.sh", {}, "--help").stdout
    assert "PLANCACHE_TIMEOUT" in help_text


def test_offline_audit_spends_the_documented_budget_on_an_unanswering_store(
    black_hole: BlackHole, tmp_path: Path
) -> None:
    """The same for the audit's ``verify`` (docs/stores.md: the journeys pass
    ``PLANCACHE_TIMEOUT`` when it is set); its failure report says which budget ran out."""
    generate_keypair(tmp_path / "ci-key", force=False, comment="ci")
    report = tmp_path / "audit.json"
    audit = script(
        "offline-audit.sh",
        {
            **AWS_ENV,
            "PLANCACHE_STORAGE_OPTIONS": f"endpoint_url={black_hole.endpoint}",
            "PLANCACHE_TIMEOUT": "1.5",
            "PLANCACHE_TRUSTED_KEYS": str(tmp_path / "ci-key.pub"),
            "AUDIT_JSON": str(report),
        },
        "s3://bucket/plans",
        timeout=60,
    )
    assert audit.returncode == 2, audit.stderr
    failed = json.loads(report.read_text())
    assert failed["ok"] is False
    assert "no answer within the 1.5 s budget" in failed["error"]["detail"], failed
    assert "PLANCACHE_TIMEOUT" in script("offline-audit.sh", {}, "--help").stdout


def test_push_to_a_file_location_whose_parent_is_missing_is_exit_2(tmp_path: Path) -> None:
    generate_keypair(tmp_path / "ci-key", force=False, comment="ci")
    profiled = _profiled(tmp_path, FP)
    typo = (tmp_path / "mnt" / "plnas" / "fleet").as_uri()
    pushed = subprocess.run(
        [
            sys.executable,
            "-m",
            "plancache.cli.main",
            "push",
            "--json",
            "--key",
            str(tmp_path / "ci-key"),
            str(profiled.path),
            typo,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        pushed.returncode == 2 and "does not exist" in json.loads(pushed.stdout)["error"]["detail"]
    )
    assert not (tmp_path / "mnt").exists()
    bake = script(
        "ci-bake.sh",
        {
            "PLANCACHE_URL": typo,
            "PLANCACHE_SIGNING_KEY": str(tmp_path / "ci-key"),
            "IMAGE_PLAN_DIR": str(tmp_path / "image"),
            "PLAN_DIR": str(profiled.path),
            "PLANCACHE_TRUSTED_KEYS": "",
        },
    )
    assert bake.returncode == 2 and not (tmp_path / "mnt").exists()
    fresh = (tmp_path / "new-store").as_uri()  # a new store under a directory that exists: fine
    assert (
        subprocess.run(
            [
                sys.executable,
                "-m",
                "plancache.cli.main",
                "push",
                "--key",
                str(tmp_path / "ci-key"),
                str(profiled.path),
                fresh,
            ],
            capture_output=True,
            timeout=60,
        ).returncode
        == 0
    )


def test_demo_embedded_and_on_a_real_store(moto_server: MotoServer) -> None:
    cmd = [sys.executable, "-m", "plancache.cli.main", "demo"]
    embedded = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert embedded.returncode == 0, embedded.stderr
    for text in ("push", "pull", "digest-mismatch", "applied", "below-baseline"):
        assert text in embedded.stdout, text
    bucket = moto_server.new_bucket()
    remote = subprocess.run(
        [
            *cmd,
            "--store",
            f"s3://{bucket}/demo",
            "--storage-option",
            f"endpoint_url={moto_server.endpoint}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **AWS_ENV},
    )
    assert remote.returncode == 0, remote.stderr
    assert "applied" in remote.stdout and "cleaned" in remote.stdout
    assert moto_server.client().list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0


def test_fsspec_environment_configuration_is_honoured(moto_server: MotoServer) -> None:
    bucket = moto_server.new_bucket()
    store = open_store(f"s3://{bucket}/p", moto_server.options, 30)
    store.put(FP, plan_bytes(), None)
    env = {**os.environ, **AWS_ENV, "FSSPEC_S3_ENDPOINT_URL": moto_server.endpoint}
    env.pop("AWS_ENDPOINT_URL", None)
    listed = subprocess.run(
        [sys.executable, "-m", "plancache.cli.main", "ls", "--json", f"s3://{bucket}/p"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert listed.returncode == 0, listed.stderr
    assert [p["fingerprint"] for p in json.loads(listed.stdout)["plans"]] == [FP]
