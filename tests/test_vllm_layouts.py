"""The hooks in layouts other than vLLM 0.33's own: vllm-ascend's worker, and vLLM main's shims.

* vllm-ascend's ``NPUWorker`` module imports ``maybe_apply_startup_plan`` /
  ``maybe_save_startup_plan`` by name, like ``gpu_worker``. torch_npu cannot be installed
  here, so a stand-in module of that shape is written under the real module name
  (``vllm_ascend.worker.worker``) and imported after, or before, the plugin installs.
* vLLM main moves ``vllm.envs`` and ``vllm.platforms`` behind compatibility shims (a module
  whose ``__getattr__`` delegates, a ``sys.modules`` alias) while ``startup_plan.py`` stays,
  importing them from their new homes. A package ``shimvllm`` is built with that layout
  around vLLM 0.33's own ``startup_plan`` source, and the plugin pointed at it.

This module imports vLLM's ``startup_plan`` (not ``gpu_worker``: tests/test_vllm_plugin.py
checks the worker's import order and must be the first to import it).
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
import textwrap
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

import vllm_cpu
from plancache.keys.keyfile import generate_keypair
from plancache.trust.plans.plan import Plan, plan_name, render_plan, sig_name
from plancache.trust.signing import sign_plan
from vllm_cpu import GIB, PLANNED_KV, UTIL, cpu_environ, engine_config, pin_device, write_tiny_model

PROFILED = -1
"""What the stand-in workers return when they would profile."""


@pytest.fixture(scope="module")
def vllm0(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    root = tmp_path_factory.mktemp("layouts")
    cpu = cpu_environ(root / "cache")
    saved = {k: os.environ.get(k) for k in (*cpu, "VLLM_ENABLE_STARTUP_PLAN")}
    os.environ.update(cpu)
    os.environ.pop("VLLM_ENABLE_STARTUP_PLAN", None)
    write_tiny_model(root / "tiny-llama")
    gpu_worker_before = "vllm.v1.worker.gpu_worker" in sys.modules
    from vllm.v1.worker import startup_plan

    from plancache.vllm_plugin import hooks

    config = engine_config(root / "tiny-llama")
    assert gpu_worker_before or "vllm.v1.worker.gpu_worker" not in sys.modules
    yield SimpleNamespace(startup_plan=startup_plan, hooks=hooks, config=config, root=root)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def lines() -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.DEBUG)
    logger = logging.getLogger("vllm.plancache")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def infos(records: list[logging.LogRecord]) -> list[str]:
    return [
        r.getMessage()
        for r in records
        if r.levelno == logging.INFO and "decision=" in r.getMessage()
    ]


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


@pytest.fixture
def clean_modules(monkeypatch: pytest.MonkeyPatch, vllm0: SimpleNamespace) -> Iterator[None]:
    """Forget the stand-in packages and uninstall the plugin afterwards, whatever happened."""
    yield
    vllm0.hooks.uninstall()
    for name in [n for n in sys.modules if n.split(".")[0] in ("vllm_ascend", "shimvllm")]:
        del sys.modules[name]


# --------------------------------------------------------------------------- vllm-ascend

ASCEND_WORKER = '''
"""Shaped like vllm_ascend/worker/worker.py: the two names imported at module level."""
from vllm.v1.worker.startup_plan import maybe_apply_startup_plan, maybe_save_startup_plan


class NPUWorker:
    def load_model(self):
        self.model_runner.load_model()

    def determine_available_memory(self):
        maybe_apply_startup_plan(self)
        if self.cache_config.kv_cache_memory_bytes:
            return self.cache_config.kv_cache_memory_bytes
        return -1

    def compile_or_warm_up_model(self, kv):
        maybe_save_startup_plan(self, kv)
'''


@pytest.mark.parametrize("imported_first", [False, True], ids=["plugin-first", "ascend-first"])
def test_vllm_ascend_worker_is_patched_by_the_same_hook(
    vllm0: SimpleNamespace,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    clean_modules: None,
    lines: list,
    imported_first: bool,
) -> None:
    hooks, sp = vllm0.hooks, vllm0.startup_plan
    assert set(hooks.WORKER_MODULES) == {"vllm.v1.worker.gpu_worker", "vllm_ascend.worker.worker"}
    write_tree(
        tmp_path / "pkgs",
        {
            "vllm_ascend/__init__.py": "",
            "vllm_ascend/worker/__init__.py": "",
            "vllm_ascend/worker/worker.py": ASCEND_WORKER,
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    monkeypatch.setenv("VLLM_ENABLE_STARTUP_PLAN", "1")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    pin_device(functools.partial(monkeypatch.setattr, raising=False))
    originals = (sp.maybe_apply_startup_plan, sp.maybe_save_startup_plan)

    if imported_first:
        ascend = importlib.import_module("vllm_ascend.worker.worker")
        assert ascend.maybe_apply_startup_plan is originals[0]
    assert hooks.install()
    ascend = importlib.import_module("vllm_ascend.worker.worker")
    assert (ascend.maybe_apply_startup_plan, ascend.maybe_save_startup_plan) == (
        hooks.apply_hook,
        hooks.save_hook,
    )
    load_model = ascend.NPUWorker.__dict__["load_model"]
    assert getattr(load_model, "__plancache__", False)

    worker = vllm_cpu.make_worker(ascend.NPUWorker, vllm0.config)
    fp = sp.compute_plan_fingerprint(worker.vllm_config, 0, 1)
    (tmp_path / "cache" / "startup_plan").mkdir(parents=True)
    (tmp_path / "cache" / "startup_plan" / plan_name(fp)).write_bytes(
        render_plan(Plan(fp, PLANNED_KV, 60 * GIB))
    )
    worker.load_model()  # the wrapped one runs the original
    assert worker.determine_available_memory() == PLANNED_KV
    assert f"decision=apply reason=applied source=local fingerprint={fp}" in infos(lines)[0]

    hooks.uninstall()
    assert (ascend.maybe_apply_startup_plan, ascend.maybe_save_startup_plan) == originals
    assert ascend.NPUWorker.__dict__["load_model"] is load_model.__wrapped__
    assert (sp.maybe_apply_startup_plan, sp.maybe_save_startup_plan) == originals


# --------------------------------------------------------------------------- vLLM main's shims

SHIM_DEVICE = "Shim Accelerator 96GB"


def shim_layout(root: Path, startup_plan_source: str, with_envs: bool = True) -> None:
    """``shimvllm``: vLLM 0.33's startup_plan, its envs and platform moved behind shims."""
    source = startup_plan_source.replace(
        "import vllm.envs as envs", "import shimvllm._next.envs as envs"
    )
    source = source.replace(
        "from vllm.platforms import current_platform",
        "from shimvllm._next.platforms import current_platform",
    )
    assert "shimvllm._next.envs" in source and "shimvllm._next.platforms" in source
    if not with_envs:  # a layout the plugin does not know: no `envs` global any more
        source = source.replace(
            "import shimvllm._next.envs as envs", "import shimvllm._next.envs as _settings"
        )
        source = source.replace("envs.VLLM_", "_settings.VLLM_")
    write_tree(
        root,
        {
            "shimvllm/__init__.py": "",
            "shimvllm/_next/__init__.py": "",
            # the new home of envs: read lazily from the environment, like vllm.envs
            "shimvllm/_next/envs.py": """
            import os
            def __getattr__(name):
                if name == "VLLM_ENABLE_STARTUP_PLAN":
                    return bool(int(os.environ.get("SHIM_ENABLE_STARTUP_PLAN", "0")))
                if name == "VLLM_CACHE_ROOT":
                    return os.environ["SHIM_CACHE_ROOT"]
                raise AttributeError(name)
        """,
            "shimvllm/_next/platforms.py": f'''
            class _Platform:
                def get_device_name(self, device_id=0):
                    return "{SHIM_DEVICE}"
                def get_device_total_memory(self, device_id=0):
                    return 96 * 2**30
                def get_device_capability(self, device_id=0):
                    return None
            current_platform = _Platform()
        ''',
            # the old places: a lazy delegate and a sys.modules alias
            "shimvllm/envs.py": """
            import importlib
            def __getattr__(name):
                return getattr(importlib.import_module("shimvllm._next.envs"), name)
        """,
            "shimvllm/platforms.py": """
            import sys
            from shimvllm._next import platforms as _moved
            sys.modules[__name__] = _moved
        """,
            "shimvllm/v1/__init__.py": "",
            "shimvllm/v1/worker/__init__.py": "",
            "shimvllm/v1/worker/startup_plan.py": source,
            # a compatibility package: attributes delegate, the submodule is a sys.modules alias
            "shimvllm/worker/__init__.py": """
            import importlib, sys
            sys.modules[__name__ + ".startup_plan"] = importlib.import_module(
                "shimvllm.v1.worker.startup_plan"
            )
            def __getattr__(name):
                return getattr(importlib.import_module("shimvllm.v1.worker"), name)
        """,
            "shimvllm/v1/worker/gpu_worker.py": """
            from shimvllm.worker.startup_plan import (
                maybe_apply_startup_plan, maybe_save_startup_plan,
            )

            class Worker:
                def load_model(self):
                    self.model_runner.load_model()

                def determine_available_memory(self):
                    maybe_apply_startup_plan(self)
                    return self.cache_config.kv_cache_memory_bytes or -1
        """,
        },
    )


@pytest.fixture
def shim(
    vllm0: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_modules: None
) -> SimpleNamespace:
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    monkeypatch.setattr(vllm0.hooks, "STARTUP_PLAN", "shimvllm.v1.worker.startup_plan")
    monkeypatch.setattr(vllm0.hooks, "WORKER_MODULES", {"shimvllm.v1.worker.gpu_worker": "Worker"})
    from plancache.vllm_plugin import plugin_state

    plugin_state.start_boot()  # a boot of its own: one warning a boot
    # vLLM's own switch is off and its cache root elsewhere: only the shim's envs say otherwise.
    monkeypatch.delenv("VLLM_ENABLE_STARTUP_PLAN", raising=False)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    monkeypatch.setenv("SHIM_ENABLE_STARTUP_PLAN", "1")
    monkeypatch.setenv("SHIM_CACHE_ROOT", str(tmp_path / "shim-cache"))
    source = Path(vllm0.startup_plan.__file__).read_text()
    return SimpleNamespace(root=tmp_path / "pkgs", source=source, tmp=tmp_path)


def test_shimmed_layout_patch_lands_where_the_worker_looks(
    vllm0: SimpleNamespace, shim: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    hooks = vllm0.hooks
    shim_layout(shim.root, shim.source)
    key_dir = shim.tmp / "keys"
    key_dir.mkdir()
    signer = generate_keypair(key_dir / "ci", force=False, comment="ci", env={})
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(key_dir / "ci.pub"))

    assert hooks.install()
    sp = sys.modules["shimvllm.v1.worker.startup_plan"]
    from plancache.vllm_plugin import adapter, plugin_state

    installed = plugin_state.current().installed
    originals = (installed.originals["apply"], installed.originals["save"])
    assert sp.maybe_apply_startup_plan is hooks.apply_hook
    assert adapter.platform() is sp.current_platform and adapter.vllm_envs() is sp.envs
    # binds through the compat alias
    gpu_worker = importlib.import_module("shimvllm.v1.worker.gpu_worker")
    assert (
        gpu_worker.maybe_apply_startup_plan is hooks.apply_hook
        and gpu_worker.maybe_save_startup_plan is hooks.save_hook
    )
    # the alias the worker imported through
    assert sys.modules["shimvllm.worker.startup_plan"] is sp
    importlib.import_module("shimvllm.platforms")
    assert sys.modules["shimvllm.platforms"] is sys.modules["shimvllm._next.platforms"]

    worker = vllm_cpu.make_worker(gpu_worker.Worker, vllm0.config)
    fp = sp.compute_plan_fingerprint(worker.vllm_config, 0, 1)  # with the shim's device facts
    plans = shim.tmp / "shim-cache" / "startup_plan"
    plans.mkdir(parents=True)
    data = render_plan(Plan(fp, PLANNED_KV, 60 * GIB))
    facts = {
        "gpu_memory_utilization": UTIL,
        "device_name": SHIM_DEVICE,
        "device_total_memory": 96 * GIB,
    }
    (plans / plan_name(fp)).write_bytes(data)
    (plans / sig_name(fp)).write_bytes(
        sign_plan(plan_name(fp), data, signer, datetime.now(timezone.utc), provenance=facts)
    )

    # Applied: so the switch, the cache root and the device facts all came from the shim's
    # envs and platform (vLLM's own say: off, another directory, "cpu").
    assert worker.determine_available_memory() == PLANNED_KV
    assert f"decision=apply reason=applied source=local fingerprint={fp}" in infos(lines)[0]
    assert not (shim.tmp / "vllm-cache").exists()

    hooks.uninstall()
    assert (sp.maybe_apply_startup_plan, sp.maybe_save_startup_plan) == originals
    assert (gpu_worker.maybe_apply_startup_plan, gpu_worker.maybe_save_startup_plan) == originals
    # only where the originals were
    assert "maybe_apply_startup_plan" not in vars(sys.modules["shimvllm.worker"])


def test_unknown_layout_is_one_warning_and_nothing_patched(
    vllm0: SimpleNamespace, shim: SimpleNamespace, lines: list
) -> None:
    hooks = vllm0.hooks
    shim_layout(shim.root, shim.source, with_envs=False)
    assert not hooks.install() and not hooks.install()
    warnings = [r.getMessage() for r in lines if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "envs" in warnings[0] and "plugin inactive" in warnings[0]
    sp = sys.modules["shimvllm.v1.worker.startup_plan"]
    assert (
        not getattr(sp.maybe_apply_startup_plan, "__plancache__", False) and not hooks.installed()
    )
