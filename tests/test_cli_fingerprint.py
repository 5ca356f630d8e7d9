"""``plancache fingerprint``: vLLM's own fingerprints for every rank, as the plugin computes them in
a worker.

On CPU with pinned device facts (tests/vllm_cpu.py). The command's fingerprints are compared
with the ones the plugin's apply path logs for Worker stand-ins of the same configuration, and
the ``--json`` factors are re-hashed the way vLLM 0.33 hashes them, so ``--explain`` shows what
the key is made of. This module imports vLLM's config code but not ``gpu_worker``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import vllm_cpu
from vllm_cpu import DEVICE_NAME, DEVICE_TOTAL, cpu_environ, pin_device, write_tiny_model

SRC = Path(__file__).resolve().parent.parent / "src"
PINS = ["--device-name", DEVICE_NAME, "--device-total-memory", str(DEVICE_TOTAL)]
TINY = ["--max-model-len", "128", "--enforce-eager", "--load-format", "dummy"]


def test_without_vllm_one_line_and_exit_2(tmp_path: Path) -> None:
    probe = (
        "import sys; sys.modules['vllm'] = None\n"  # as if the [vllm] extra were not installed
        "import plancache.cli.diagnose.fingerprint\n"
        "from plancache.cli.main import main\n"
        "sys.exit(main(['fingerprint', '--', 'some/model']))"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.splitlines()) == 1 and "needs the [vllm] extra" in out.stderr


@pytest.fixture(scope="module")
def vllm_cfg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    root = tmp_path_factory.mktemp("fingerprint")
    cpu = cpu_environ(root / "cache")
    saved = {k: os.environ.get(k) for k in (*cpu, "VLLM_ENABLE_STARTUP_PLAN")}
    os.environ.update(cpu)
    os.environ.pop("VLLM_ENABLE_STARTUP_PLAN", None)
    model = root / "tiny-llama"
    write_tiny_model(model)
    from vllm.v1.worker import startup_plan

    yield SimpleNamespace(model=model, root=root, startup_plan=startup_plan)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from plancache.cli.main import main

    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


class StandIn:
    """A worker object: the plugin only reads the attributes vllm_cpu.make_worker sets."""


def plugin_fingerprints(
    vllm_cfg: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, **engine: Any
) -> list[str]:
    """What the plugin's apply path computes in each rank's worker for this configuration."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    from plancache.vllm_plugin import boot

    cfg = AsyncEngineArgs(
        model=str(vllm_cfg.model),
        max_model_len=128,
        enforce_eager=True,
        load_format="dummy",
        **engine,
    ).create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    monkeypatch.setenv("VLLM_ENABLE_STARTUP_PLAN", "1")
    with monkeypatch.context() as m:
        pin_device(functools.partial(m.setattr, raising=False))
        records: list[str] = []

        class Records(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                records.append(record.getMessage())

        handler = Records()
        logging.getLogger("vllm.plancache").addHandler(handler)
        try:
            for rank in range(cfg.parallel_config.world_size):
                worker = vllm_cpu.make_worker(StandIn, cfg)
                worker.rank = worker.local_rank = rank
                boot.apply(worker, vllm_cfg.startup_plan.compute_plan_fingerprint)
        finally:
            logging.getLogger("vllm.plancache").removeHandler(handler)
    return [
        re.search(r"fingerprint=([0-9a-f]{16})", line).group(1)
        for line in records
        if "decision=" in line
    ]


@pytest.mark.parametrize(
    "parallel",
    [
        {"tensor_parallel_size": 2},
        {"tensor_parallel_size": 2, "pipeline_parallel_size": 2},
    ],
    ids=["tp2", "tp2xpp2"],
)
def test_every_rank_matches_the_plugin_in_a_worker(
    vllm_cfg: SimpleNamespace,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    parallel: dict[str, int],
) -> None:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in parallel.items()]
    code, out, err = run_cli(
        capsys,
        "fingerprint",
        "--json",
        *PINS,
        "--",
        str(vllm_cfg.model),
        *TINY,
        *flags,
        "--port",
        "8000",
    )
    assert code == 0, err
    result = json.loads(out)  # stdout is the JSON alone (vLLM's logs go to stderr)
    world = 1
    for size in parallel.values():
        world *= size
    assert result["world_size"] == world and [r["rank"] for r in result["ranks"]] == list(
        range(world)
    )
    assert result["ignored_arguments"] == ["--port", "8000"] and "ignored: --port 8000" in err
    assert [r["fingerprint"] for r in result["ranks"]] == plugin_fingerprints(
        vllm_cfg, monkeypatch, **parallel
    )
    assert len({r["fingerprint"] for r in result["ranks"]}) == world
    for entry in result["ranks"]:  # --explain's factors are exactly what vLLM hashes
        factors = entry["factors"]
        digest = hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest()[:16]
        assert digest == entry["fingerprint"]
        assert (factors["device_name"], factors["device_total_memory"]) == (
            DEVICE_NAME,
            DEVICE_TOTAL,
        )
        assert factors["vllm"] == "0.33.0" and factors["world_size"] == world
    # the pins were put back on vLLM's platform
    assert vllm_cfg.startup_plan.current_platform.get_device_name() != DEVICE_NAME


def test_explain_prints_the_factors_and_the_model_as_hashed(
    vllm_cfg: SimpleNamespace, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(
        capsys, "fingerprint", "--explain", *PINS, "--", str(vllm_cfg.model), *TINY
    )
    assert code == 0
    assert out.splitlines()[0].startswith("rank 0/1  ")
    for factor in (
        "vllm ",
        "vllm_config ",
        "device_name ",
        "device_total_memory ",
        "device_capability",
        "torch ",
        "cuda",
        "rank ",
        "world_size ",
        "model (as hashed)",
    ):
        assert f"    {factor}" in out, factor
    assert str(vllm_cfg.model) in out and DEVICE_NAME in out


def test_the_model_path_is_hashed_as_given(
    vllm_cfg: SimpleNamespace, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Measured: the same directory named another way is another fingerprint (docs/vllm-plugin.md:
    same path on every node)."""
    link = tmp_path / "same-model"
    link.symlink_to(vllm_cfg.model)

    def fp(model: str) -> str:
        code, out, err = run_cli(capsys, "fingerprint", "--json", *PINS, "--", model, *TINY)
        assert code == 0, err
        return str(json.loads(out)["ranks"][0]["fingerprint"])

    same = fp(str(vllm_cfg.model))
    assert fp(str(vllm_cfg.model)) == same
    assert fp(str(vllm_cfg.model) + "/") != same
    assert fp(str(link)) != same


def test_no_serve_arguments_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "fingerprint", "--explain")
    assert code == 2 and out == "" and "after --" in err


def test_a_hub_model_id_not_in_the_local_cache_offline_is_one_line_saying_so(
    vllm_cfg: SimpleNamespace,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    code, out, err = run_cli(
        capsys,
        "fingerprint",
        "--device-name",
        "X",
        "--device-total-memory",
        "1",
        "--",
        "nonexistent-org/nonexistent-model",
    )
    line = [entry for entry in err.splitlines() if entry.startswith("plancache:")]
    assert code == 2 and out == "" and len(line) == 1 and "internal error" not in err
    assert (
        "offline, a hub model id must be in the local Hugging Face cache" in line[0]
        and "\\x0a" not in line[0]
    )


def test_without_a_gpu_or_a_platform_it_says_why_a_cpu_box_cannot_stand_in(
    vllm_cfg: SimpleNamespace, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_TARGET_DEVICE"}
    env.update(PYTHONPATH=str(SRC), HF_HUB_OFFLINE="1", VLLM_CACHE_ROOT=str(tmp_path / "cache"))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "plancache.cli.main",
            "fingerprint",
            "--device-name",
            "NVIDIA H100",
            "--device-total-memory",
            "85520809984",
            "--",
            str(vllm_cfg.model),
            *TINY,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    line = [entry for entry in out.stderr.splitlines() if entry.startswith("plancache:")]
    assert out.returncode == 2 and out.stdout == "" and len(line) == 1
    assert "VLLM_TARGET_DEVICE=cpu" in line[0] and "cannot match a GPU node's" in line[0]
