"""The recipes of docs/journeys.md, run: the Dockerfile's bake stage and the Kubernetes init
container.

Docker cannot run here (no daemon in CI), so what a build would do is stood in for, and said:
``pip install`` by this test environment; ``plancache-ci-bake`` / ``plancache-spot-boot`` by the
packaged journeys run with this interpreter (``plancache.journeys.run``, what the installed
entry points call); the BuildKit secret by a key file; the bucket by moto's S3 server (the
bucket name in the recipe is kept, the endpoint comes from ``AWS_ENDPOINT_URL``); absolute
paths in the image by a temp dir. Every COPY and RUN line of the stage is executed in order.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import FP, plan_bytes
from plancache.keys.keyfile import generate_keypair
from plancache.storage.local.localdir import LocalPlanDir
from plancache.trust.plans.plan import plan_name, sig_name
from store_servers import (
    AWS_ENV,
    MotoServer,
    moto_server,  # noqa: F401 - a fixture, named as a parameter
)

RECIPES = Path(__file__).resolve().parent.parent / "docs" / "journeys.md"
"""The page the README's recipes moved to."""
SPOT_BOOT_DOC = (
    Path(__file__).resolve().parent.parent / "src" / "plancache" / "journeys" / "spot-boot.sh"
)


def block(kind: str, containing: str) -> str:
    for match in re.finditer(rf"```{kind}\n(.*?)```", RECIPES.read_text(), re.S):
        if containing in match.group(1):
            return match.group(1)
    raise AssertionError(f"no ```{kind} block with {containing!r} in {RECIPES.name}")


def instructions(dockerfile: str, stage: str) -> list[tuple[str, str]]:
    """(instruction, arguments) of one stage, continuation lines joined."""
    text = dockerfile.replace("\\\n", " ")
    out: list[tuple[str, str]] = []
    current = None
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "FROM":
            current = rest.split(" AS ")[-1].strip() if " AS " in rest else None
        elif word and current == stage:
            out.append((word, rest.strip()))
    return out


def bin_dir(tmp: Path) -> Path:
    """``plancache-*`` commands as the installed entry points run them, with this interpreter."""
    bindir = tmp / "bin"
    bindir.mkdir()
    for name in ("ci-bake", "spot-boot", "offline-audit"):
        exe = bindir / f"plancache-{name}"
        exe.write_text(
            f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c "
            f"'import sys; from plancache.journeys import run; run(\"{name}\", sys.argv[1:])' "
            '"$@"\n'
        )
        exe.chmod(0o755)
    return bindir


def test_dockerfile_bake_stage_and_init_container(moto_server: MotoServer, tmp_path: Path) -> None:
    moto_server.client().create_bucket(Bucket="acme-plans")
    context, root = tmp_path / "context", tmp_path / "root"
    signer = generate_keypair(context / "secrets" / "ci-signer", force=False, comment="ci-signer")
    LocalPlanDir(context / "build" / "vllm-cache" / "startup_plan").write(FP, plan_bytes(), None)
    env = {
        **os.environ,
        **AWS_ENV,
        "AWS_ENDPOINT_URL": moto_server.endpoint,
        "PATH": f"{bin_dir(tmp_path)}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    env.pop("PLANCACHE", None)

    def in_root(path: str) -> str:
        return str(root / path.lstrip("/")) if path.startswith("/") else path

    ran = []
    for word, args in instructions(block("dockerfile", "AS bake"), "bake"):
        if word == "COPY":
            src, dst = args.split()
            target = Path(in_root(dst))
            if (context / src).is_dir():
                shutil.copytree(context / src, target, dirs_exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(context / src, target)
        elif word == "RUN" and args.startswith("pip install"):
            continue  # stood in for by the test environment
        elif word == "RUN":
            secret = re.match(r"--mount=type=secret,id=[\w-]+,target=(\S+)\s+", args)
            command = args[secret.end() :] if secret else args
            if secret:
                command = command.replace(secret.group(1), str(context / "secrets" / "ci-signer"))
            command = re.sub(
                r"(?<=[=\s])/(bake|opt|etc)/", lambda m: f"{root}/{m.group(1)}/", command
            )
            done = subprocess.run(
                ["bash", "-c", command], env=env, capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, done.stderr
            ran.append(command)
        else:
            raise AssertionError(f"the test does not know how to run {word}")
    assert ran and "plancache-ci-bake" in ran[-1]
    image = root / "bake" / "image"
    # what COPY --from=bake takes
    assert sorted(p.name for p in image.iterdir()) == [plan_name(FP), sig_name(FP)]
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "plancache.cli.main",
            "inspect",
            "--json",
            "--trusted-keys",
            str(root / "bake" / "ci-signer.pub"),
            str(image / sig_name(FP)),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    info = json.loads(shown.stdout)
    assert info["status"] == "valid" and info["signed_by"][0]["keyid"] == signer.keyid
    assert set(info["statement"]["provenance"]) == {
        "gpu_memory_utilization",
        "device_name",
        "device_total_memory",
    }

    pod = yaml.safe_load(block("yaml", "initContainers"))
    [init] = pod["spec"]["initContainers"]
    [vllm] = pod["spec"]["containers"]
    assert init["command"] == ["plancache-spot-boot"]
    init_env = {e["name"]: e["value"] for e in init["env"]}
    documented = set(
        re.findall(r"\b(PLANCACHE_[A-Z_]+|VLLM_CACHE_ROOT)\b", SPOT_BOOT_DOC.read_text())
    )
    assert set(init_env) <= documented | {"VLLM_CACHE_ROOT"}
    vllm_env = {e["name"]: e["value"] for e in vllm["env"]}
    assert (
        vllm_env["VLLM_ENABLE_STARTUP_PLAN"] == "1"
        and vllm_env["VLLM_CACHE_ROOT"] == init_env["VLLM_CACHE_ROOT"]
    )
    mounts = {
        c["name"]: {m["name"]: m["mountPath"] for m in c["volumeMounts"]} for c in (init, vllm)
    }
    assert mounts[init["name"]] == mounts[vllm["name"]] == {"plans": init_env["VLLM_CACHE_ROOT"]}

    # run the init container's command with its environment (image paths mapped into the temp root)
    keys_path = root / init_env["PLANCACHE_TRUSTED_KEYS"].lstrip("/")
    keys_path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(root / "bake" / "ci-signer.pub", keys_path)
    node_env = {
        **env,
        **{k: (in_root(v) if v.startswith("/") else v) for k, v in init_env.items()},
        "PLANCACHE_STRICT": "1",
    }
    boot = subprocess.run(
        init["command"], env=node_env, capture_output=True, text=True, timeout=120
    )
    assert boot.returncode == 0, boot.stderr
    pulled = Path(node_env["VLLM_CACHE_ROOT"]) / "startup_plan"
    assert sorted(p.name for p in pulled.iterdir()) == [plan_name(FP), sig_name(FP)]
