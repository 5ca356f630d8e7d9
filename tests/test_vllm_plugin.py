"""The vLLM plugin against the real vLLM 0.33 modules, on CPU.

Everything that imports vLLM lives in this one module and in tests/vllm_cpu.py, the CPU
stand-ins it shares with scripts/bench_plugin.py (the import costs ~10 s here): module
fixtures import vLLM once, build one real ``VllmConfig`` for a tiny model directory written
by the test, and register the plugin through its installed entry point the way
``vllm.plugins.load_general_plugins()`` does. Each test then boots a ``Worker`` stand-in
(``object.__new__(Worker)``, as in ../shared/notes/vllm-on-cpu.md) and calls the real
``Worker.determine_available_memory()``; only the GPU bits are faked: the device name and
total memory that vLLM's fingerprint asks for, the free memory snapshot, the model runner's
``profile_run`` (all from tests/vllm_cpu.py), and ``memory_profiling`` (which needs an
accelerator; faked here, as only these tests profile).

Every test that registers the plugin unregisters it on teardown and checks that vLLM's
original functions are back, so no case sees another's patches.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import vllm_cpu
from plancache.clock import Deadline
from plancache.keys.keyfile import generate_keypair, load_keyring
from plancache.trust.keyring.keys import Ed25519Signer
from plancache.trust.plans.plan import Plan, parse_plan, plan_name, render_plan, sig_name
from plancache.trust.signing import sign_plan
from plancache.trust.verify import verify_plan
from realtime import SLACK_S
from store_servers import (
    AWS_ENV,
    BlackHole,
    MotoServer,
    azurite,  # noqa: F401 - a fixture, named as a parameter
    black_hole,  # noqa: F401 - a fixture, named as a parameter
    moto_server,  # noqa: F401 - a fixture, named as a parameter
)
from vllm_cpu import (
    DEVICE_TOTAL,
    FREE,
    GIB,
    PLANNED_KV,
    UTIL,
    conditions,
    cpu_environ,
    engine_config,
    load_plugins_like_vllm,
    pin_device,
    write_tiny_model,
)

PROFILED_NON_KV = 3 * GIB
"""The fake profiler's non-KV memory: a profiled boot returns ``requested - this``."""

PLUGIN_LOGGER = "vllm.plancache"


# --------------------------------------------------------------------------- module fixtures


@pytest.fixture(scope="module")
def vllm_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """Import vLLM once, in the order a worker does, and build a real VllmConfig."""
    root = tmp_path_factory.mktemp("vllm")
    cpu = cpu_environ(root / "cache")
    saved = {k: os.environ.get(k) for k in (*cpu, "VLLM_ENABLE_STARTUP_PLAN")}
    os.environ.update(cpu)
    os.environ.pop("VLLM_ENABLE_STARTUP_PLAN", None)
    model = root / "tiny-llama"
    write_tiny_model(model)

    # by another module: see the test
    worker_imported_first = "vllm.v1.worker.gpu_worker" in sys.modules
    from vllm.v1.worker import startup_plan

    originals = {
        "apply": startup_plan.maybe_apply_startup_plan,
        "save": startup_plan.maybe_save_startup_plan,
    }
    # The production order: a worker loads the general plugins, then imports its worker class.
    os.environ["VLLM_ENABLE_STARTUP_PLAN"] = "1"
    load_plugins_like_vllm()
    from plancache.vllm_plugin import hooks

    patched_before_import = startup_plan.maybe_apply_startup_plan is hooks.apply_hook
    seen_by_hook: dict[str, Any] = {}
    patch_gpu_worker = hooks._patch_worker_module

    def spy(module: Any) -> None:  # what gpu_worker bound by itself, before the hook touches it
        seen_by_hook.update(
            apply=module.maybe_apply_startup_plan, save=module.maybe_save_startup_plan
        )
        patch_gpu_worker(module)

    hooks._patch_worker_module = spy
    try:
        from vllm.v1.worker import gpu_worker
    finally:
        hooks._patch_worker_module = patch_gpu_worker

    import_order = SimpleNamespace(
        worker_imported_first=worker_imported_first,
        startup_plan_patched=patched_before_import,
        bound_by_from_import=seen_by_hook,
        gpu_worker_apply=gpu_worker.maybe_apply_startup_plan,
        gpu_worker_save=gpu_worker.maybe_save_startup_plan,
        load_model_wrapped=getattr(
            gpu_worker.Worker.__dict__["load_model"], "__plancache__", False
        ),
    )
    import plancache.vllm_plugin as plugin

    plugin.unregister()
    os.environ.pop("VLLM_ENABLE_STARTUP_PLAN", None)
    originals["load_model"] = gpu_worker.Worker.__dict__["load_model"]

    config = engine_config(model)
    yield SimpleNamespace(
        startup_plan=startup_plan,
        gpu_worker=gpu_worker,
        Worker=gpu_worker.Worker,
        originals=originals,
        import_order=import_order,
        config=config,
        model=model,
        hooks=hooks,
    )
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@contextlib.contextmanager
def _fake_memory_profiling(snapshot: Any, weights_memory: int = 0) -> Iterator[SimpleNamespace]:
    yield SimpleNamespace(
        total_consumed=2 * GIB,
        transient_peak_headroom=1 * GIB,
        non_kv_cache_memory=PROFILED_NON_KV,
        after_profile=SimpleNamespace(free_memory=snapshot.free_memory - PROFILED_NON_KV),
        before_create=snapshot,
    )


@pytest.fixture
def env(
    vllm_env: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> SimpleNamespace:
    """A fresh cache root and plancache environment per test, plus the GPU pins."""
    for name in list(os.environ):
        if name.startswith("PLANCACHE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    pin_device(functools.partial(monkeypatch.setattr, raising=False))
    monkeypatch.setattr(vllm_env.gpu_worker, "memory_profiling", _fake_memory_profiling)
    vllm_env.plan_dir = tmp_path / "cache" / "startup_plan"
    vllm_env.tmp = tmp_path
    return vllm_env


@pytest.fixture
def lines() -> Iterator[list[logging.LogRecord]]:
    """Records of the plugin's logger (vLLM's own 'vllm' logger does not propagate to root)."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.DEBUG)
    logger = logging.getLogger(PLUGIN_LOGGER)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)


def infos(records: list[logging.LogRecord]) -> list[str]:
    return [
        r.getMessage()
        for r in records
        if r.levelno == logging.INFO and "decision=" in r.getMessage()
    ]


def errors(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.levelno >= logging.ERROR]


def _assert_originals(env: SimpleNamespace) -> None:
    sp, gw = env.startup_plan, env.gpu_worker
    assert sp.maybe_apply_startup_plan is env.originals["apply"]
    assert sp.maybe_save_startup_plan is env.originals["save"]
    assert gw.maybe_apply_startup_plan is env.originals["apply"]
    assert gw.maybe_save_startup_plan is env.originals["save"]
    assert env.Worker.__dict__["load_model"] is env.originals["load_model"]


@pytest.fixture
def plugin(env: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """The plugin registered through its entry point with the feature on; removed afterwards."""
    import plancache.vllm_plugin as plugin_module

    monkeypatch.setenv("VLLM_ENABLE_STARTUP_PLAN", "1")
    load_plugins_like_vllm()
    assert env.startup_plan.maybe_apply_startup_plan is env.hooks.apply_hook
    yield env
    plugin_module.unregister()
    _assert_originals(env)


def make_worker(
    env: SimpleNamespace,
    free: int = FREE,
    util: float = UTIL,
    kv: int | None = None,
    load_seconds: float = 0.0,
) -> Any:
    return vllm_cpu.make_worker(
        env.Worker, env.config, free=free, util=util, kv=kv, load_seconds=load_seconds
    )


def profiled_bytes(util: float = UTIL) -> int:
    return int(DEVICE_TOTAL * util) - PROFILED_NON_KV


def fingerprint(env: SimpleNamespace, worker: Any) -> str:
    return env.startup_plan.compute_plan_fingerprint(
        worker.vllm_config, worker.rank, worker.parallel_config.world_size
    )


# --------------------------------------------------------------------------- keys and plans


@pytest.fixture
def keys(tmp_path: Path) -> SimpleNamespace:
    """A signing key pair on disk (keygen's format) and a second, untrusted one."""
    key_dir = tmp_path / "keys"
    key_dir.mkdir()
    ci = generate_keypair(key_dir / "ci", force=False, comment="ci", env={})
    other = generate_keypair(key_dir / "other", force=False, comment="other", env={})
    return SimpleNamespace(
        signer=ci,
        private=key_dir / "ci",
        trusted=key_dir / "ci.pub",
        other=other,
    )


def write_plan(
    directory: Path,
    fp: str,
    signer: Ed25519Signer | None = None,
    kv: int = PLANNED_KV,
    baseline: int = 60 * GIB,
    signed_at: datetime | None = None,
    expires_at: datetime | None = None,
    provenance: dict[str, Any] | None = None,
) -> tuple[bytes, bytes | None]:
    directory.mkdir(parents=True, exist_ok=True)
    data = render_plan(Plan(fp, kv, baseline))
    (directory / plan_name(fp)).write_bytes(data)
    sig = None
    if signer is not None:
        now = signed_at or datetime.now(timezone.utc)
        sig = sign_plan(
            plan_name(fp),
            data,
            signer,
            now,
            expires_at=expires_at,
            provenance=conditions() if provenance is None else provenance,
        )
        (directory / sig_name(fp)).write_bytes(sig)
    return data, sig


# --------------------------------------------------------------------------- registration


def test_registered_before_gpu_worker_import_patches_what_the_worker_calls(
    vllm_env: SimpleNamespace,
) -> None:
    """The worker's order: plugins load, then gpu_worker is imported and binds the patched names."""
    order = vllm_env.import_order
    assert not order.worker_imported_first, (
        "another test module imported vLLM's gpu_worker before this one"
    )
    assert order.startup_plan_patched
    # gpu_worker's own `from startup_plan import ...` already bound the hooks: patching the
    # startup_plan module before gpu_worker is imported suffices for apply and save.
    assert order.bound_by_from_import == {
        "apply": vllm_env.hooks.apply_hook,
        "save": vllm_env.hooks.save_hook,
    }
    assert order.gpu_worker_apply is vllm_env.hooks.apply_hook
    assert order.gpu_worker_save is vllm_env.hooks.save_hook
    assert order.load_model_wrapped
    # ... and after unregister() everything is vLLM's again.
    _assert_originals(vllm_env)


def test_entry_point_is_installed_and_registering_twice_is_idempotent(
    plugin: SimpleNamespace,
) -> None:
    (entry,) = [
        e
        for e in importlib.metadata.entry_points(group="vllm.general_plugins")
        if e.name == "plancache"
    ]
    assert entry.value == "plancache.vllm_plugin:register"
    before = (plugin.gpu_worker.maybe_apply_startup_plan, plugin.Worker.__dict__["load_model"])
    entry.load()()
    load_plugins_like_vllm()
    after = (plugin.gpu_worker.maybe_apply_startup_plan, plugin.Worker.__dict__["load_model"])
    assert before == after
    assert plugin.gpu_worker.maybe_apply_startup_plan is plugin.hooks.apply_hook
    wrapped = plugin.Worker.__dict__["load_model"]
    assert wrapped.__wrapped__ is plugin.originals["load_model"]  # wrapped once, not twice


def test_feature_off_leaves_vllm_byte_for_byte_unchanged(
    env: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    """Plugin installed, VLLM_ENABLE_STARTUP_PLAN unset: vLLM's own functions, the same results, the
    same files."""
    monkeypatch.delenv("VLLM_ENABLE_STARTUP_PLAN", raising=False)

    def boot(cache: Path) -> tuple[int, int, list[str]]:
        monkeypatch.setenv("VLLM_CACHE_ROOT", str(cache))
        worker = make_worker(env)
        result = worker.determine_available_memory()
        env.gpu_worker.maybe_save_startup_plan(worker, result)
        files = (
            sorted(str(p.relative_to(cache)) for p in cache.rglob("*")) if cache.exists() else []
        )
        return result, worker.model_runner.profile_runs, files

    without = boot(env.tmp / "without")
    load_plugins_like_vllm()
    _assert_originals(env)
    assert "plancache.vllm_plugin.hooks" not in sys.modules or not env.hooks.installed()
    with_plugin = boot(env.tmp / "with")
    assert with_plugin == without == (profiled_bytes(), 1, [])

    # vLLM reads its switch at call time: turned on after the plugin declined to register, it is
    # vLLM's own code that saves and applies, writing the same bytes as with no plugin at all.
    monkeypatch.setenv("VLLM_ENABLE_STARTUP_PLAN", "1")

    def two_boots(cache: Path) -> tuple[int, int, dict[str, bytes]]:
        first = boot(cache)
        second = make_worker(env)
        return (
            first[0],
            second.determine_available_memory(),
            {
                str(p.relative_to(cache)): p.read_bytes()
                for p in sorted(cache.rglob("*"))
                if p.is_file()
            },
        )

    assert two_boots(env.tmp / "with-on") == two_boots(env.tmp / "without-on")
    kv, applied, files = two_boots(env.tmp / "again")
    assert applied == kv and list(files) == [
        f"startup_plan/{plan_name(fingerprint(env, make_worker(env)))}"
    ]
    assert lines == []


def test_vllm_internals_missing_one_warning_and_untouched(
    env: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    monkeypatch.setenv("VLLM_ENABLE_STARTUP_PLAN", "1")
    monkeypatch.delattr(env.startup_plan, "compute_plan_fingerprint")
    from plancache.vllm_plugin import plugin_state

    plugin_state.start_boot()  # a boot of its own: one warning a boot
    load_plugins_like_vllm()
    load_plugins_like_vllm()
    warnings = [r.getMessage() for r in lines if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "compute_plan_fingerprint not found" in warnings[0]
    monkeypatch.undo()
    _assert_originals(env)


# --------------------------------------------------------------------------- apply: local


def test_signed_local_hit_is_applied_with_one_info_line(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    worker = make_worker(plugin)
    fp = fingerprint(plugin, worker)
    write_plan(plugin.plan_dir, fp, keys.signer)
    assert worker.determine_available_memory() == PLANNED_KV
    assert worker.cache_config.kv_cache_memory_bytes == PLANNED_KV
    assert worker.model_runner.profile_runs == 1  # vLLM's compile-only profile run, no measurement
    (line,) = infos(lines)
    assert f"decision=apply reason=applied source=local fingerprint={fp}" in line
    assert "elapsed_ms=" in line and f"kv_cache_memory_bytes={PLANNED_KV}" in line
    # exactly one line
    assert [r.getMessage() for r in lines if r.levelno >= logging.INFO] == [line]


def test_an_apply_boot_never_waits_for_a_remote_signing_key(
    plugin: SimpleNamespace,
    keys: SimpleNamespace,
    monkeypatch: pytest.MonkeyPatch,
    lines: list,
    black_hole: BlackHole,
) -> None:
    """The signing key is only needed to sign a new plan: a KMS key that does not answer costs
    a boot that applies a plan nothing (it used to cost PLANCACHE_TIMEOUT per rank)."""
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    monkeypatch.setenv("PLANCACHE_SIGNING_KEY", "awskms:///alias/ci")
    monkeypatch.setenv("AWS_ENDPOINT_URL_KMS", black_hole.endpoint)
    monkeypatch.setenv("PLANCACHE_TIMEOUT", "10")
    for name, value in AWS_ENV.items():
        monkeypatch.setenv(name, value)
    worker = make_worker(plugin)
    write_plan(plugin.plan_dir, fingerprint(plugin, worker), keys.signer)
    started = time.monotonic()
    assert worker.determine_available_memory() == PLANNED_KV
    assert time.monotonic() - started < 10.0 and black_hole.held == []  # the KMS was never called
    assert "decision=apply" in infos(lines)[0] and errors(lines) == []


def _profiled(worker: Any, lines: list, reason: str, source: str = "local") -> str:
    assert worker.determine_available_memory() == profiled_bytes(
        worker.cache_config.gpu_memory_utilization
    )
    assert worker.cache_config.kv_cache_memory_bytes is None
    (line,) = infos(lines)
    assert f"decision=profile reason={reason} source={source}" in line, line
    return line


def test_tampered_local_plan_is_profiled(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    worker = make_worker(plugin)
    fp = fingerprint(plugin, worker)
    data, _ = write_plan(plugin.plan_dir, fp, keys.signer)
    (plugin.plan_dir / plan_name(fp)).write_bytes(data.replace(b"53687091200", b"63687091200"))
    _profiled(worker, lines, "digest-mismatch")


def test_untrusted_signer_is_profiled(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    worker = make_worker(plugin)
    write_plan(plugin.plan_dir, fingerprint(plugin, worker), keys.other)
    _profiled(worker, lines, "untrusted-key")


def test_expired_signature_is_profiled(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    worker = make_worker(plugin)
    long_ago = datetime.now(timezone.utc) - timedelta(days=40)
    write_plan(
        plugin.plan_dir,
        fingerprint(plugin, worker),
        keys.signer,
        signed_at=long_ago,
        expires_at=long_ago + timedelta(days=30),
    )
    _profiled(worker, lines, "expired")


def test_below_baseline_is_profiled(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    worker = make_worker(plugin, free=55 * GIB)
    write_plan(plugin.plan_dir, fingerprint(plugin, worker), keys.signer, baseline=60 * GIB)
    _profiled(worker, lines, "below-baseline")


def test_changed_gpu_memory_utilization_is_profiled(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    """gpu_memory_utilization is not in vLLM's config hash: same fingerprint, other budget."""
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    worker = make_worker(plugin, util=0.5)
    fp = fingerprint(plugin, worker)
    assert fp == fingerprint(plugin, make_worker(plugin, util=UTIL))  # vLLM's key does not see it
    write_plan(plugin.plan_dir, fp, keys.signer, provenance=conditions(UTIL))
    line = _profiled(worker, lines, "condition-mismatch")
    assert "gpu_memory_utilization" in line


def test_other_device_model_is_profiled(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    worker = make_worker(plugin)
    write_plan(
        plugin.plan_dir,
        fingerprint(plugin, worker),
        keys.signer,
        provenance={**conditions(), "device_name": "NVIDIA A100-SXM4-80GB"},
    )
    assert "device_name" in _profiled(worker, lines, "condition-mismatch")


def test_unsigned_local_plan_with_trusted_keys_is_profiled(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    worker = make_worker(plugin)
    write_plan(plugin.plan_dir, fingerprint(plugin, worker))
    _profiled(worker, lines, "unsigned")


def test_no_trusted_keys_admits_local_plans_unsigned_but_strictly(
    plugin: SimpleNamespace, lines: list
) -> None:
    """The no-keys policy: vLLM's behaviour (trust the cache dir), with plancache's strict
    parser."""
    worker = make_worker(plugin)
    fp = fingerprint(plugin, worker)
    write_plan(plugin.plan_dir, fp)
    assert worker.determine_available_memory() == PLANNED_KV
    assert "decision=apply reason=applied source=local" in infos(lines)[0]

    # vLLM's own gate takes `true` as an int; plancache's parser does not.
    lines.clear()
    worker = make_worker(plugin)
    (plugin.plan_dir / plan_name(fp)).write_text(
        json.dumps(
            {
                "schema": 1,
                "fingerprint": fp,
                "kv_cache_memory_bytes": True,
                "free_memory_baseline": 60 * GIB,
            }
        )
    )
    assert (
        plugin.startup_plan._applicable_kv_cache_memory_bytes(
            plugin.startup_plan._load_plan(fp), FREE
        )
        is True
    )
    _profiled(worker, lines, "malformed")


def test_no_plan_is_profiled(plugin: SimpleNamespace, lines: list) -> None:
    _profiled(make_worker(plugin), lines, "no-plan", source="none")


def test_kv_cache_memory_bytes_already_set_is_left_alone(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    worker = make_worker(plugin, kv=7 * GIB)
    write_plan(plugin.plan_dir, fingerprint(plugin, worker), keys.signer)
    assert worker.determine_available_memory() == 7 * GIB
    (line,) = infos(lines)
    assert "decision=skip reason=already-set" in line


def test_unreadable_trusted_keys_is_one_error_line_and_profiles(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    """A configured but unusable keyring never downgrades to the unsigned policy."""
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(plugin.tmp / "missing.pub"))
    worker = make_worker(plugin)
    write_plan(plugin.plan_dir, fingerprint(plugin, worker), keys.signer)
    _profiled(worker, lines, "config-error")
    (error,) = errors(lines)
    assert "PLANCACHE_TRUSTED_KEYS" in error and "missing.pub" in error and "\n" not in error


def test_url_without_trusted_keys_is_one_error_line_and_store_ignored(
    plugin: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    monkeypatch.setenv("PLANCACHE_URL", "s3://bucket/never-contacted")
    worker = make_worker(plugin)
    _profiled(worker, lines, "no-plan", source="none")
    (error,) = errors(lines)
    assert "PLANCACHE_URL" in error and "PLANCACHE_TRUSTED_KEYS" in error


def test_bad_url_is_one_error_line_and_profiles(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    monkeypatch.setenv("PLANCACHE_URL", "nosuchprotocol://bucket/plans")
    worker = make_worker(plugin)
    _profiled(worker, lines, "config-error", source="store")
    (error,) = errors(lines)
    assert "nosuchprotocol" in error


def test_an_exception_inside_plancache_is_logged_and_vllm_profiles(
    plugin: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    from plancache.vllm_plugin import boot

    def explode(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(boot, "decide_plan", explode)
    line = _profiled(make_worker(plugin), lines, "internal-error", source="none")
    assert "boom" in line


# --------------------------------------------------------------------------- save


def test_plan_bytes_are_exactly_what_vllm_writes(
    env: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """trust.plan.render_plan against vLLM's real maybe_save_startup_plan."""
    monkeypatch.setenv("VLLM_ENABLE_STARTUP_PLAN", "1")
    worker = make_worker(env)
    fp = fingerprint(env, worker)
    env.originals["save"](worker, 12345 * GIB // 1000)
    written = (env.plan_dir / plan_name(fp)).read_bytes()
    assert written == render_plan(Plan(fp, 12345 * GIB // 1000, FREE))


def test_vllm_saved_plan_is_picked_up_signed_and_written_where_the_next_boot_looks(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    monkeypatch.setenv("PLANCACHE_SIGNING_KEY", str(keys.private))
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    worker = make_worker(plugin)
    profiled = worker.determine_available_memory()  # miss: profiled
    fp = fingerprint(plugin, worker)
    kv = profiled - GIB
    plugin.gpu_worker.maybe_save_startup_plan(worker, kv)  # the name compile_or_warm_up_model calls
    data = (plugin.plan_dir / plan_name(fp)).read_bytes()
    assert data == render_plan(Plan(fp, kv, FREE))  # vLLM's bytes, unchanged
    verified = verify_plan(
        plan_name(fp),
        data,
        (plugin.plan_dir / sig_name(fp)).read_bytes(),
        load_keyring(keys.trusted),
        datetime.now(timezone.utc),
    )
    assert verified.statement is not None
    facts = dict(verified.statement.provenance)
    assert facts == {
        **conditions(),
        "model": str(plugin.model),
        "vllm_version": "0.33.0",
        "torch_version": facts["torch_version"],
        "rank": 0,
        "world_size": 1,
    }
    assert facts["torch_version"].startswith("2.13")
    # vLLM's own loader accepts it, and the next boot applies it.
    assert plugin.startup_plan._load_plan(fp)["kv_cache_memory_bytes"] == kv
    lines.clear()
    nxt = make_worker(plugin)
    assert nxt.determine_available_memory() == kv
    assert "decision=apply reason=applied source=local" in infos(lines)[0]


def test_save_time_fingerprint_can_differ_and_plancache_saves_under_the_apply_time_one(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    """FINDING (vLLM 0.33, real VllmConfig): the fingerprint hashes the compilation config,
    and ``resolve_cudagraph_mode_and_sizes`` (run by the model runner when the KV cache is
    initialised, i.e. after ``determine_available_memory`` and before
    ``compile_or_warm_up_model`` saves) rewrites ``cudagraph_mode`` and the capture sizes.
    With cudagraphs (FULL decode graphs + spec decode, or an attention backend that cannot do
    FULL graphs) the save-time fingerprint differs from the apply-time one, so vLLM saves a
    plan that no later boot looks up. With ``enforce_eager`` (cudagraph_mode NONE, our CPU
    config) the two are equal. plancache saves under the apply-time fingerprint of this boot.
    """
    from vllm.config import CUDAGraphMode
    from vllm.v1.attention.backend import AttentionCGSupport

    # Eager (as built): resolving changes nothing, the fingerprints agree.
    eager = make_worker(plugin)
    before = fingerprint(plugin, eager)
    eager.vllm_config.compilation_config.resolve_cudagraph_mode_and_sizes(
        AttentionCGSupport.ALWAYS, "X"
    )
    assert fingerprint(plugin, eager) == before

    # With graphs, as on a GPU: vLLM's own resolution step changes the fingerprint.
    monkeypatch.setenv("PLANCACHE_SIGNING_KEY", str(keys.private))
    worker = make_worker(plugin)
    cc = worker.vllm_config.compilation_config
    cc.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    cc.cudagraph_capture_sizes = [1, 2, 4, 8]
    cc.max_cudagraph_capture_size = 8
    # apply: miss, profile; remembers its fingerprint
    profiled = worker.determine_available_memory()
    apply_fp = fingerprint(plugin, worker)
    assert f"fingerprint={apply_fp}" in infos(lines)[0]
    cc.resolve_cudagraph_mode_and_sizes(
        AttentionCGSupport.UNIFORM_BATCH, "SomeBackend", uniform_decode_query_len=2
    )
    save_fp = fingerprint(plugin, worker)
    assert save_fp != apply_fp
    plugin.gpu_worker.maybe_save_startup_plan(worker, profiled)

    assert (plugin.plan_dir / plan_name(save_fp)).exists()  # what vLLM alone would leave
    assert (plugin.plan_dir / plan_name(apply_fp)).exists() and (
        plugin.plan_dir / sig_name(apply_fp)
    ).exists()
    assert (
        parse_plan(
            (plugin.plan_dir / plan_name(apply_fp)).read_bytes(), plan_name(apply_fp)
        ).kv_cache_memory_bytes
        == profiled
    )
    # vLLM's loader takes it
    assert plugin.startup_plan._load_plan(apply_fp)["kv_cache_memory_bytes"] == profiled
    # A fresh boot of the same config computes the apply-time fingerprint again.
    fresh = make_worker(plugin)
    fresh.vllm_config.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    fresh.vllm_config.compilation_config.cudagraph_capture_sizes = [1, 2, 4, 8]
    fresh.vllm_config.compilation_config.max_cudagraph_capture_size = 8
    assert fingerprint(plugin, fresh) == apply_fp
    lines.clear()
    assert fresh.determine_available_memory() == profiled
    assert "decision=apply" in infos(lines)[0]


def test_save_with_unusable_signing_key_writes_vllms_plan_unsigned(
    plugin: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    monkeypatch.setenv("PLANCACHE_SIGNING_KEY", str(plugin.tmp / "nokey"))
    worker = make_worker(plugin)
    kv = worker.determine_available_memory()
    plugin.gpu_worker.maybe_save_startup_plan(worker, kv)
    fp = fingerprint(plugin, worker)
    assert (plugin.plan_dir / plan_name(fp)).exists() and not (
        plugin.plan_dir / sig_name(fp)
    ).exists()
    (error,) = errors(lines)
    assert "PLANCACHE_SIGNING_KEY" in error


# --------------------------------------------------------------------- store (file://) and prefetch


def _store_env(
    monkeypatch: pytest.MonkeyPatch, keys: SimpleNamespace, url: str, timeout: float = 3.0
) -> None:
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    monkeypatch.setenv("PLANCACHE_URL", url)
    monkeypatch.setenv("PLANCACHE_TIMEOUT", str(timeout))


def test_prefetch_starts_with_load_model_and_apply_uses_it(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    bucket = plugin.tmp / "bucket"
    _store_env(monkeypatch, keys, bucket.as_uri())
    worker = make_worker(plugin, load_seconds=0.3)
    fp = fingerprint(plugin, worker)
    data, sig = write_plan(bucket, fp, keys.signer)
    worker.load_model()  # the real, wrapped Worker.load_model: starts the prefetch, then loads
    boot = worker._plancache_boot
    assert boot.prefetch is not None and boot.prefetch.key == fp
    assert boot.prefetch.started < boot.prefetch.finished
    assert worker.determine_available_memory() == PLANNED_KV
    (line,) = infos(lines)
    assert (
        f"decision=apply reason=applied source=store fingerprint={fp}" in line
        and "prefetch " in line
    )
    # written locally, atomically, with its sidecar; vLLM's own loader accepts the file
    assert (plugin.plan_dir / plan_name(fp)).read_bytes() == data
    assert (plugin.plan_dir / sig_name(fp)).read_bytes() == sig
    assert plugin.startup_plan._load_plan(fp)["kv_cache_memory_bytes"] == PLANNED_KV
    assert not [p for p in plugin.plan_dir.iterdir() if p.name.startswith(".")]


def test_prefetch_is_skipped_when_the_plan_is_local(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    _store_env(monkeypatch, keys, "s3://never-contacted/plans")
    worker = make_worker(plugin)
    write_plan(plugin.plan_dir, fingerprint(plugin, worker), keys.signer)
    worker.load_model()
    assert worker._plancache_boot.prefetch is None
    assert worker.determine_available_memory() == PLANNED_KV
    assert "source=local" in infos(lines)[0]


def test_a_local_hit_never_computes_the_other_ranks_fingerprints(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    """The plan set's name needs every rank's key (one vLLM config hash each): only after a
    local miss, never on the warm path."""
    from plancache.vllm_plugin import boot

    asked: list[str] = []
    real = boot.world_of
    monkeypatch.setattr(boot, "world_of", lambda *a: asked.append("world") or real(*a))
    _store_env(monkeypatch, keys, "s3://never-contacted/plans")
    worker = make_worker(plugin)
    write_plan(plugin.plan_dir, fingerprint(plugin, worker), keys.signer)
    worker.load_model()
    assert worker.determine_available_memory() == PLANNED_KV and "source=local" in infos(lines)[0]
    assert asked == []
    bucket = plugin.tmp / "bucket"  # a miss: the world is computed (once), the store read
    _store_env(monkeypatch, keys, bucket.as_uri())
    other = make_worker(plugin)
    other.cache_config.kv_cache_memory_bytes = None
    for path in plugin.plan_dir.iterdir():
        path.unlink()
    write_plan(bucket, fingerprint(plugin, other), keys.signer)
    assert other.determine_available_memory() == PLANNED_KV and asked == ["world"]


def test_bad_local_plan_falls_back_to_a_good_store_plan(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    bucket = plugin.tmp / "bucket"
    _store_env(monkeypatch, keys, bucket.as_uri())
    worker = make_worker(plugin)
    fp = fingerprint(plugin, worker)
    write_plan(plugin.plan_dir, fp, keys.other)  # stale, signed by a key nobody trusts
    data, _ = write_plan(bucket, fp, keys.signer)
    assert worker.determine_available_memory() == PLANNED_KV
    (line,) = infos(lines)
    assert "decision=apply reason=applied source=store" in line and "untrusted-key" in line
    assert (plugin.plan_dir / plan_name(fp)).read_bytes() == data  # the cache healed


def test_tampered_store_plan_is_profiled_and_nothing_is_written(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    bucket = plugin.tmp / "bucket"
    _store_env(monkeypatch, keys, bucket.as_uri())
    worker = make_worker(plugin)
    fp = fingerprint(plugin, worker)
    data, _ = write_plan(bucket, fp, keys.signer)
    (bucket / plan_name(fp)).write_bytes(data.replace(b"53687091200", b"73687091200"))
    _profiled(worker, lines, "digest-mismatch", source="store")
    assert not plugin.plan_dir.exists() or not list(plugin.plan_dir.iterdir())


def test_save_signs_and_pushes_in_the_background(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    bucket = plugin.tmp / "bucket"
    bucket.mkdir()
    _store_env(monkeypatch, keys, bucket.as_uri())
    monkeypatch.setenv("PLANCACHE_SIGNING_KEY", str(keys.private))
    worker = make_worker(plugin)
    kv = worker.determine_available_memory()
    plugin.gpu_worker.maybe_save_startup_plan(worker, kv)
    fp = fingerprint(plugin, worker)
    worker._plancache_boot.push_thread.join(5)
    assert worker._plancache_boot.push_result == "pushed"
    # A profiling boot that signs and pushes still says one INFO line: its decision.
    assert (
        len([r for r in lines if r.levelno == logging.INFO]) == 1
        and "decision=profile" in infos(lines)[0]
    )
    assert (bucket / plan_name(fp)).read_bytes() == (plugin.plan_dir / plan_name(fp)).read_bytes()
    assert (bucket / sig_name(fp)).read_bytes() == (plugin.plan_dir / sig_name(fp)).read_bytes()
    # A spot machine with an empty cache now boots from the store.
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(plugin.tmp / "spot-cache"))
    lines.clear()
    spot = make_worker(plugin)
    assert spot.determine_available_memory() == kv
    assert "decision=apply reason=applied source=store" in infos(lines)[0]


# --------------------------------------------------------------------------- store (loopback S3)


def _s3_env(
    monkeypatch: pytest.MonkeyPatch,
    keys: SimpleNamespace,
    endpoint_options: dict[str, Any],
    url: str,
    timeout: float,
) -> None:
    for name, value in AWS_ENV.items():
        monkeypatch.setenv(name, value)
    _store_env(monkeypatch, keys, url, timeout)
    monkeypatch.setenv("PLANCACHE_STORAGE_OPTIONS", json.dumps(endpoint_options))


def test_store_hit_on_loopback_s3_is_applied_and_written_locally(
    plugin: SimpleNamespace,
    keys: SimpleNamespace,
    moto_server: MotoServer,
    monkeypatch: pytest.MonkeyPatch,
    lines: list,
) -> None:
    bucket = moto_server.new_bucket()
    _s3_env(monkeypatch, keys, moto_server.options, f"s3://{bucket}/plans", 3.0)
    worker = make_worker(plugin, load_seconds=0.5)
    fp = fingerprint(plugin, worker)
    staging = plugin.tmp / "staging"
    data, sig = write_plan(staging, fp, keys.signer)
    client = moto_server.client()
    client.put_object(Bucket=bucket, Key=f"plans/{plan_name(fp)}", Body=data)
    client.put_object(Bucket=bucket, Key=f"plans/{sig_name(fp)}", Body=sig)

    worker.load_model()  # prefetch overlaps the (simulated) weight load
    assert worker.determine_available_memory() == PLANNED_KV
    (line,) = infos(lines)
    # the plan came from the prefetch that overlapped the weight load (no timing asserted: shared
    # machines)
    assert (
        f"decision=apply reason=applied source=store fingerprint={fp}" in line
        and "prefetch " in line
    )
    assert (plugin.plan_dir / plan_name(fp)).read_bytes() == data
    assert (plugin.plan_dir / sig_name(fp)).read_bytes() == sig
    # vLLM's loader accepts it
    assert plugin.startup_plan._load_plan(fp)["kv_cache_memory_bytes"] == PLANNED_KV


def test_store_hit_without_prefetch_fetches_within_the_budget(
    plugin: SimpleNamespace,
    keys: SimpleNamespace,
    moto_server: MotoServer,
    monkeypatch: pytest.MonkeyPatch,
    lines: list,
) -> None:
    bucket = moto_server.new_bucket()
    _s3_env(monkeypatch, keys, moto_server.options, f"s3://{bucket}", 3.0)
    worker = make_worker(plugin)
    fp = fingerprint(plugin, worker)
    data, sig = write_plan(plugin.tmp / "staging", fp, keys.signer)
    moto_server.client().put_object(Bucket=bucket, Key=plan_name(fp), Body=data)
    moto_server.client().put_object(Bucket=bucket, Key=sig_name(fp), Body=sig)
    assert worker.determine_available_memory() == PLANNED_KV
    assert "source=store" in infos(lines)[0] and "fetch " in infos(lines)[0]


@pytest.mark.parametrize("prefetch", [False, True], ids=["inline", "prefetch"])
def test_black_holed_store_is_profiled_within_the_budget(
    plugin: SimpleNamespace,
    keys: SimpleNamespace,
    black_hole: BlackHole,
    monkeypatch: pytest.MonkeyPatch,
    lines: list,
    prefetch: bool,
) -> None:
    budget = 1.0
    _s3_env(monkeypatch, keys, {"endpoint_url": black_hole.endpoint}, "s3://bucket/plans", budget)
    worker = make_worker(plugin, load_seconds=0.3)
    started = time.monotonic()
    if prefetch:
        worker.load_model()
    result = worker.determine_available_memory()
    elapsed = time.monotonic() - started
    assert result == profiled_bytes()
    (line,) = infos(lines)
    assert "decision=profile" in line and "source=store" in line
    assert "reason=timeout" in line or "reason=store-error" in line
    # it ends by the budget, not by the SDK's retries (tests/realtime.py)
    assert elapsed <= budget + SLACK_S, f"boot took {elapsed:.2f} s of a {budget} s budget: {line}"


def test_an_inline_lookup_opens_the_store_by_its_own_deadline(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening the store (the SDK's import: up to a second on a busy machine) is part of the
    lookup's budget: a lookup whose deadline is near gives up by it, not a whole budget after the
    opening began (the local read and the world's fingerprints had already spent part of it).
    A 30 s budget and a filesystem that takes a minute to open: the lookup due in 0.3 s ends
    seconds later at most, never 30 s later."""
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    from plancache.vllm_plugin import boot as boot_module

    # a filesystem whose construction takes longer than any budget
    class SlowToOpen(LocalFileSystem):
        cachable = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            time.sleep(60)
            super().__init__(*args, **kwargs)

    fsspec.register_implementation("plancache-slow-open", SlowToOpen, clobber=True)
    _store_env(monkeypatch, keys, "plancache-slow-open:///plans", 30.0)
    worker = make_worker(plugin)
    boot = boot_module.boot_for(worker)
    due = Deadline.after(0.3)
    result = boot_module._resolve(boot, fingerprint(plugin, worker), due)
    elapsed = due.elapsed()
    assert (
        result.verified is None and result.error is not None and result.error.reason == "timeout"
    ), result
    assert elapsed < 0.3 + SLACK_S, f"gave up after {elapsed:.2f} s, for a lookup due in 0.3 s"


def test_save_pushes_to_loopback_s3_and_a_spot_boot_applies_it(
    plugin: SimpleNamespace,
    keys: SimpleNamespace,
    moto_server: MotoServer,
    monkeypatch: pytest.MonkeyPatch,
    lines: list,
) -> None:
    """CI bake then spot boot, through the plugin alone: vLLM's saved plan, signed, pushed, pulled,
    applied."""
    bucket = moto_server.new_bucket()
    _s3_env(monkeypatch, keys, moto_server.options, f"s3://{bucket}/plans", 3.0)
    monkeypatch.setenv("PLANCACHE_SIGNING_KEY", str(keys.private))
    worker = make_worker(plugin)
    kv = worker.determine_available_memory()
    started = time.monotonic()
    plugin.gpu_worker.maybe_save_startup_plan(worker, kv)
    assert time.monotonic() - started < 0.5  # the push runs in the background
    worker._plancache_boot.push_thread.join(5)
    assert worker._plancache_boot.push_result == "pushed"
    fp = fingerprint(plugin, worker)
    body = (
        moto_server.client().get_object(Bucket=bucket, Key=f"plans/{plan_name(fp)}")["Body"].read()
    )
    assert body == (plugin.plan_dir / plan_name(fp)).read_bytes()

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(plugin.tmp / "spot"))
    monkeypatch.delenv("PLANCACHE_SIGNING_KEY")
    lines.clear()
    spot = make_worker(plugin, load_seconds=0.2)
    spot.load_model()
    assert spot.determine_available_memory() == kv
    assert "decision=apply reason=applied source=store" in infos(lines)[0]


def test_black_holed_store_never_delays_save(
    plugin: SimpleNamespace,
    keys: SimpleNamespace,
    black_hole: BlackHole,
    monkeypatch: pytest.MonkeyPatch,
    lines: list,
) -> None:
    _s3_env(monkeypatch, keys, {"endpoint_url": black_hole.endpoint}, "s3://bucket/plans", 1.0)
    monkeypatch.setenv("PLANCACHE_SIGNING_KEY", str(keys.private))
    monkeypatch.delenv("PLANCACHE_TRUSTED_KEYS")  # no trusted keys: the store is never read,
    worker = make_worker(plugin)  # only the push meets the black hole
    kv = worker.determine_available_memory()
    started = time.monotonic()
    plugin.gpu_worker.maybe_save_startup_plan(worker, kv)
    assert time.monotonic() - started < 0.5
    worker._plancache_boot.push_thread.join(3)
    assert not worker._plancache_boot.push_thread.is_alive()
    assert worker._plancache_boot.push_result.startswith("failed")
    # signed locally all the same
    assert (plugin.plan_dir / sig_name(fingerprint(plugin, worker))).exists()


# ------------------------------------------------------------------- configuration (no vLLM needed)


def test_config_parsing_never_raises_and_names_each_problem() -> None:
    from plancache.vllm_plugin.config import DEFAULT_TIMEOUT, parse_config

    good = parse_config(
        {
            "PLANCACHE_URL": "s3://bucket/plans",
            "PLANCACHE_TIMEOUT": "1.5",
            "PLANCACHE_STORAGE_OPTIONS": (
                '{"endpoint_url": "http://127.0.0.1:9000", "client_kwargs": {"region_name": "x"}}'
            ),
            "PLANCACHE_THRESHOLD": "2",
        }
    )
    assert (good.url, good.timeout, good.threshold, good.errors) == (
        "s3://bucket/plans",
        1.5,
        2,
        (),
    )
    assert good.storage_options["client_kwargs"] == {"region_name": "x"}
    # the scripts' form: space-separated KEY=VALUE, values parsed as JSON where they parse
    pairs = parse_config(
        {
            "PLANCACHE_URL": "s3://b",
            "PLANCACHE_STORAGE_OPTIONS": "endpoint_url=http://minio:9000 anon=true",
        }
    )
    assert (
        pairs.storage_options == {"endpoint_url": "http://minio:9000", "anon": True}
        and pairs.errors == ()
    )
    bad = parse_config(
        {
            "PLANCACHE_URL": "bucket/plans",
            "PLANCACHE_TIMEOUT": "nan",
            "PLANCACHE_STORAGE_OPTIONS": "[1, 2]",
            "PLANCACHE_THRESHOLD": "zero",
        }
    )
    assert bad.url is None and bad.timeout == DEFAULT_TIMEOUT and bad.threshold == 0
    assert [e.split("=")[0].split(":")[0] for e in bad.errors] == [
        "PLANCACHE_URL",
        "PLANCACHE_TIMEOUT",
        "PLANCACHE_THRESHOLD",
        "PLANCACHE_STORAGE_OPTIONS",
    ]


def test_plugin_module_import_with_feature_off_imports_nothing_heavy(tmp_path: Path) -> None:
    import subprocess

    probe = (
        "import sys, os; os.environ.pop('VLLM_ENABLE_STARTUP_PLAN', None); "
        "before = set(sys.modules)\n"
        "import plancache.vllm_plugin as p; p.register()\n"
        "print(sorted(set(sys.modules) - before))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert out.stdout.strip() in (
        "['__future__', 'plancache', 'plancache.vllm_plugin']",
        "['plancache', 'plancache.vllm_plugin']",
    )


def test_ci_bake_without_trusted_keys_pushes_but_never_reads_the_store(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    """Signing key + URL, no trusted keys (a CI profiling runner): push only, no ERROR line."""
    bucket = plugin.tmp / "bucket"
    bucket.mkdir()
    monkeypatch.setenv("PLANCACHE_URL", bucket.as_uri())
    monkeypatch.setenv("PLANCACHE_SIGNING_KEY", str(keys.private))
    # a push, not a deadline: room for a loaded CI machine (3 s failed there)
    monkeypatch.setenv("PLANCACHE_TIMEOUT", "30")
    worker = make_worker(plugin)
    fp = fingerprint(plugin, worker)
    write_plan(bucket, fp, keys.signer)  # present in the store, but never read without trusted keys
    _profiled(worker, lines, "no-plan", source="none")
    plugin.gpu_worker.maybe_save_startup_plan(worker, profiled_bytes())
    worker._plancache_boot.push_thread.join(60)
    assert worker._plancache_boot.push_result == "pushed"
    # A profiling boot that signs and pushes still says one INFO line: its decision.
    assert (
        len([r for r in lines if r.levelno == logging.INFO]) == 1
        and "decision=profile" in infos(lines)[0]
    )
    assert (bucket / plan_name(fp)).read_bytes() == (plugin.plan_dir / plan_name(fp)).read_bytes()
    assert errors(lines) == []


def test_store_hit_on_loopback_azure_is_applied_and_written_locally(
    plugin: SimpleNamespace,
    keys: SimpleNamespace,
    azurite: Any,
    monkeypatch: pytest.MonkeyPatch,
    lines: list,
) -> None:
    """The plugin reads az:// through the same Store: a hit within the budget, credentials from the
    env."""
    from azure.storage.blob import BlobServiceClient

    container = azurite.new_container()
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    _store_env(monkeypatch, keys, f"az://{container}/plans", 3.0)
    worker = make_worker(plugin)
    fp = fingerprint(plugin, worker)
    data, sig = write_plan(plugin.tmp / "staging", fp, keys.signer)
    client = BlobServiceClient.from_connection_string(
        azurite.connection_string
    ).get_container_client(container)
    client.upload_blob(f"plans/{plan_name(fp)}", data)
    client.upload_blob(f"plans/{sig_name(fp)}", sig)
    assert worker.determine_available_memory() == PLANNED_KV
    (line,) = infos(lines)
    assert f"decision=apply reason=applied source=store fingerprint={fp}" in line
    assert (plugin.plan_dir / plan_name(fp)).read_bytes() == data
    assert (plugin.plan_dir / sig_name(fp)).read_bytes() == sig


def test_a_bad_threshold_with_trusted_keys_applies_nothing(tmp_path: Path) -> None:
    """Never a downgrade: PLANCACHE_THRESHOLD=0 beside good keys is the unusable policy, not
    unsigned admission."""
    from plancache.vllm_plugin.worker_boot import load_boot

    generate_keypair(tmp_path / "k", force=False, comment="k")
    for raw, kind in (("0", "unusable"), ("two", "unusable"), ("1", "signed")):
        boot = load_boot(
            {"PLANCACHE_TRUSTED_KEYS": f"{tmp_path / 'k'}.pub", "PLANCACHE_THRESHOLD": raw}
        )
        assert boot.policy.kind == kind, raw
    # no keys named at all
    assert load_boot({"PLANCACHE_THRESHOLD": "0"}).policy.kind == "unsigned-local"


# ------------------------------------------------------------- workers without plans, vLLM releases


def test_cpu_worker_gets_one_decision_line_and_nothing_else(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    """vLLM's CPUWorker overrides determine_available_memory and never applies or saves a plan:
    the plan side says so once and reads nothing (no configuration, no plan file, no store)."""
    from vllm.v1.worker.cpu_worker import CPUWorker

    from store_servers import closed_port

    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    monkeypatch.setenv("PLANCACHE_URL", "s3://bucket/plans")
    monkeypatch.setenv(
        "PLANCACHE_STORAGE_OPTIONS", f"endpoint_url=http://127.0.0.1:{closed_port()}"
    )
    worker = make_worker(plugin, kv=None)
    worker.__class__ = CPUWorker
    assert CPUWorker.load_model is plugin.Worker.load_model  # inherited, so wrapped by the plugin
    worker.load_model()
    worker.load_model()
    (line,) = infos(lines)
    assert "decision=skip reason=worker-without-plans source=none fingerprint=-" in line, line
    assert (
        "vLLM 0.33 CPUWorker (vllm.v1.worker.cpu_worker.CPUWorker.determine_available_memory)"
        in line
    ), line
    assert not hasattr(worker, "_plancache_boot")  # no configuration read, no prefetch started
    assert not plugin.plan_dir.exists() or list(plugin.plan_dir.iterdir()) == []
    assert errors(lines) == []
    # CPUWorker's own compile_or_warm_up_model (it never calls Worker's) still ends the boot record
    worker.model_runner.kv_caches = [object()]
    worker.use_v2_model_runner = False
    worker.compilation_config = worker.vllm_config.compilation_config
    worker.compile_or_warm_up_model()
    record = _record_line(lines)
    assert (record["plan"]["decision"], record["plan"]["reason"], record["final"]) == (
        "skip",
        "worker-without-plans",
        True,
    )


def test_a_gpu_worker_subclass_still_uses_plans(plugin: SimpleNamespace) -> None:
    from plancache.vllm_plugin.adapter import uses_startup_plans

    class Inherits(plugin.Worker):
        pass

    class CallsSuper(plugin.Worker):
        def determine_available_memory(self) -> int:
            return super().determine_available_memory()

    class Replaces(plugin.Worker):
        def determine_available_memory(self) -> int:
            return 0

    worker = make_worker(plugin)
    assert uses_startup_plans(worker)
    for cls, expected in ((Inherits, True), (CallsSuper, True), (Replaces, False)):
        worker.__class__ = cls
        assert uses_startup_plans(worker) is expected, cls


def test_vllm_release_is_told_by_the_modules_shape_not_the_distribution(
    env: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0.33's CompilerManager takes use_aot_compile, 0.32's (vllm-cpu) does not; the engine tests
    check "0.32" on vllm-cpu itself, whose distribution is not named vllm."""
    from vllm.compilation import backends

    from plancache.vllm_plugin.adapter import vllm_release

    assert vllm_release() == "0.33"

    def init_032(self: Any, compilation_config: Any) -> None: ...

    def init_other(self: Any, config: Any) -> None: ...

    monkeypatch.setattr(backends.CompilerManager, "__init__", init_032)
    assert vllm_release() == "0.32"
    monkeypatch.setattr(backends.CompilerManager, "__init__", init_other)
    assert vllm_release() is None


# -------------------------------------------------------------------------- boot records (issue 20)


def _records(env: SimpleNamespace) -> list[dict[str, Any]]:
    directory = env.tmp / "cache" / "plancache" / "boot"
    return (
        [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]
        if directory.is_dir()
        else []
    )


def _finish_boot(env: SimpleNamespace, worker: Any, kv: int | None = None) -> None:
    """The real, wrapped ``Worker.compile_or_warm_up_model``; its GPU half (warm-up, graph
    capture) is the stand-in's, which, after a profiled boot, saves the plan as vLLM's does."""
    worker.use_v2_model_runner = False
    worker._compile_or_warm_up_model = lambda: (
        None if kv is None else env.gpu_worker.maybe_save_startup_plan(worker, kv)
    )
    worker.compile_or_warm_up_model()


def _record_line(lines: list) -> dict[str, Any]:
    (line,) = [r.getMessage() for r in lines if "boot-record " in r.getMessage()]
    return json.loads(line.split("boot-record ", 1)[1])


def test_an_applied_boot_records_its_decision_and_the_profiling_it_saved(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    worker = make_worker(plugin)
    fp = fingerprint(plugin, worker)
    data = render_plan(Plan(fp, PLANNED_KV, 60 * GIB))
    plugin.plan_dir.mkdir(parents=True)
    (plugin.plan_dir / plan_name(fp)).write_bytes(data)
    (plugin.plan_dir / sig_name(fp)).write_bytes(
        sign_plan(
            plan_name(fp),
            data,
            keys.signer,
            datetime.now(timezone.utc),
            provenance=conditions(),
            measurements={"profile_ms": 60000.0},
        )
    )
    assert worker.determine_available_memory() == PLANNED_KV
    (early,) = _records(plugin)  # written at the decision: a boot that dies later still leaves it
    assert (
        early["final"] is False
        and early["plan"]["decision"] == "apply"
        and early["plan"]["reason"] == "applied"
    )
    _finish_boot(plugin, worker)
    (record,) = _records(plugin)
    assert (
        record == _record_line(lines)
        and record["schema"] == "plancache.boot/v1"
        and record["final"] is True
    )
    assert (record["plan"]["fingerprint"], record["plan"]["source"], record["rank"]) == (
        fp,
        "local",
        0,
    )
    assert 0 < record["saved_ms"]["profiling"] <= 60000 and record["saved_ms"]["compile"] is None
    assert record["plugin_ms"] > 0 and record["warnings"] == []


def test_a_profiled_boot_records_the_miss_and_signs_the_inputs_and_the_profiling_time(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    from plancache.trust.inputs import fingerprint_of_inputs

    monkeypatch.setenv("PLANCACHE_SIGNING_KEY", str(keys.private))
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    worker = make_worker(plugin)
    kv = worker.determine_available_memory()
    _finish_boot(plugin, worker, kv - GIB)
    fp = fingerprint(plugin, worker)
    (record,) = _records(plugin)
    assert (record["plan"]["decision"], record["plan"]["reason"], record["final"]) == (
        "profile",
        "no-plan",
        True,
    )
    assert record["saved_ms"]["profiling"] is None
    verified = verify_plan(
        plan_name(fp),
        (plugin.plan_dir / plan_name(fp)).read_bytes(),
        (plugin.plan_dir / sig_name(fp)).read_bytes(),
        load_keyring(keys.trusted),
        datetime.now(timezone.utc),
    )
    statement = verified.statement
    # exactly what vLLM hashed
    assert statement is not None and fingerprint_of_inputs(statement.inputs) == fp
    assert (
        statement.inputs["vllm"] == "0.33.0"
        and statement.inputs["device_total_memory"] == DEVICE_TOTAL
    )
    assert statement.measurements["profile_ms"] == record["plan"]["determine_ms"]
    assert {"model_config", "cache_config", "compilation_config"} <= set(statement.config_parts)


def test_the_plugin_signs_keylessly_and_the_next_boot_records_the_identity(
    plugin: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    """Issue 37 items 1 and 5: ``PLANCACHE_SIGNING_KEY=sigstore`` makes the plugin's own save a
    Sigstore bundle (through the local Fulcio and Rekor of tests/sigstore_stack.py), and a later
    boot, every Sigstore server stopped, applies it and its record names the identity."""
    from sigstore_stack import SigstoreStack

    identity = "https://github.com/acme/serving/.github/workflows/bake.yml@refs/heads/main"
    with SigstoreStack() as stack:
        for name, data in (
            ("config.json", stack.trust_config_bytes()),
            ("root.json", stack.trusted_root_bytes()),
            ("trusted", f"sigstore issuer={stack.issuer} identity={identity}\n".encode()),
        ):
            (plugin.tmp / name).write_bytes(data)
        monkeypatch.setenv("SIGSTORE_ID_TOKEN", stack.token(identity))
        monkeypatch.setenv("PLANCACHE_SIGNING_KEY", "sigstore")
        monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUST_CONFIG", str(plugin.tmp / "config.json"))
        monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUSTED_ROOT", str(plugin.tmp / "root.json"))
        monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(plugin.tmp / "trusted"))
        worker = make_worker(plugin)
        kv = worker.determine_available_memory() - GIB
        _finish_boot(plugin, worker, kv)
        issuer = stack.issuer
    fp = fingerprint(plugin, worker)
    bundle = json.loads((plugin.plan_dir / sig_name(fp)).read_bytes())
    assert bundle["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    lines.clear()
    nxt = make_worker(plugin)
    assert nxt.determine_available_memory() == kv
    assert "decision=apply reason=applied source=local" in infos(lines)[0]
    _finish_boot(plugin, nxt)
    (record,) = [r for r in _records(plugin) if r["plan"]["decision"] == "apply"]
    (who,) = record["plan"]["signed_by"]
    assert (who["identity"], who["issuer"]) == (identity, issuer) and who["log_index"] >= 5


def test_a_boot_whose_store_is_down_records_why(
    plugin: SimpleNamespace,
    keys: SimpleNamespace,
    black_hole: BlackHole,
    monkeypatch: pytest.MonkeyPatch,
    lines: list,
) -> None:
    _s3_env(monkeypatch, keys, {"endpoint_url": black_hole.endpoint}, "s3://bucket/plans", 0.5)
    worker = make_worker(plugin)
    worker.determine_available_memory()
    _finish_boot(plugin, worker)
    (record,) = _records(plugin)
    assert record["plan"]["decision"] == "profile" and record["plan"]["source"] == "store"
    assert record["plan"]["reason"] in ("timeout", "store-error")


def test_a_boot_record_carries_no_credential_of_the_store_url(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    """The record file is written beside the log line, not through the plugin's log filter: its
    details are redacted where they are made. A store URL with credentials that cannot be read
    (nothing listens on port 1) leaves them in neither."""
    _s3_env(
        monkeypatch,
        keys,
        {"endpoint_url": "http://127.0.0.1:1"},
        "s3://AKIAPLANTED:PLANTEDSECRET@bucket/plans",
        2.0,
    )
    worker = make_worker(plugin)
    worker.determine_available_memory()
    _finish_boot(plugin, worker)
    (record,) = _records(plugin)
    assert record["plan"]["decision"] == "profile" and record["plan"]["source"] == "store"
    # the URL is there, masked
    assert "***@bucket" in record["plan"]["detail"], record["plan"]["detail"]
    files = "".join(
        p.read_text() for p in (plugin.tmp / "cache" / "plancache" / "boot").glob("*.json")
    )
    for text in (files, "\n".join(r.getMessage() for r in lines)):
        assert "PLANTEDSECRET" not in text and "AKIAPLANTED" not in text


def test_boot_records_are_bounded_and_never_written_through_a_link(
    plugin: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    from plancache.storage.local import records

    for _ in range(3):
        worker = make_worker(plugin)
        worker.determine_available_memory()
        _finish_boot(plugin, worker)
    assert len(_records(plugin)) == 3
    root = plugin.tmp / "cache"
    names = [n for n, _ in records.read_last(root, 10)]
    assert names == sorted(names, reverse=True) and len(names) == 3
    for i in range(5):
        records.write(root, f"2000010{i}T000000Z-1-r0-0000000{i}.json", b"{}", keep=4)
    assert len(list((root / "plancache" / "boot").glob("*.json"))) == 4  # the oldest removed
    shutil_target = plugin.tmp / "elsewhere"
    shutil_target.mkdir()
    boot_dir = root / "plancache" / "boot"
    for p in boot_dir.iterdir():
        p.unlink()
    boot_dir.rmdir()
    boot_dir.symlink_to(shutil_target)  # a planted link where the records go
    worker = make_worker(plugin)
    worker.determine_available_memory()  # the boot goes on; nothing lands behind the link
    assert list(shutil_target.iterdir()) == []


def test_a_boot_record_whose_first_write_failed_still_prunes_at_its_next(
    plugin: SimpleNamespace, lines: list
) -> None:
    """A record's rewrites skip the directory's prune listing, but only once a write of it
    succeeded: a first write that failed (here the records' directory is a file; on a node, a
    full disk) must not stop the next one from removing the oldest records (a crash-looping
    worker fills the directory otherwise)."""
    from plancache.storage.local import records

    boot_dir = plugin.tmp / "cache" / "plancache" / "boot"
    boot_dir.parent.mkdir(parents=True)
    boot_dir.write_bytes(b"")  # the decision's write fails
    worker = make_worker(plugin)
    worker.determine_available_memory()  # the decision's record, then the profiling's: both fail
    assert not any(r.levelno >= logging.WARNING for r in lines)
    boot_dir.unlink()
    boot_dir.mkdir()
    for i in range(records.KEEP + 5):  # older boots' records, past the bound
        (
            boot_dir / f"2000{i // 28 + 1:02d}{i % 28 + 1:02d}T000000Z-1-r0-00000000.json"
        ).write_bytes(b"{}")
    _finish_boot(plugin, worker)  # this record's first write that succeeds
    assert len(list(boot_dir.glob("*.json"))) == records.KEEP


def test_doctor_shows_the_last_boot_records(
    plugin: SimpleNamespace,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    lines: list,
) -> None:
    from plancache.cli.main import main

    worker = make_worker(plugin)
    worker.determine_available_memory()
    _finish_boot(plugin, worker)
    code = main(["doctor", "--json"])
    doc = json.loads(capsys.readouterr().out)
    (check,) = [c for c in doc["checks"] if c["name"] == "boot-records"]
    assert check["status"] == "ok" and "plan profile (no-plan)" in check["detail"]
    assert check["data"]["records"][0]["plan"]["reason"] == "no-plan" and code in (0, 1)
    main(["doctor"])
    assert "BOOT" in capsys.readouterr().out


# ------------------------------------------------------------- plans that are right (issue 49)


def _signed_local_plan(
    env: SimpleNamespace, keys: SimpleNamespace, fp: str, kv: int = PLANNED_KV
) -> tuple[bytes, bytes]:
    data, sig = write_plan(env.plan_dir, fp, keys.signer, kv=kv)
    assert sig is not None
    return data, sig


def _decision(lines: list) -> str:
    (line,) = infos(lines)
    lines.clear()
    return line


def test_a_profiling_boot_never_overwrites_the_signed_plan(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    """Item 5: a node below the baseline once profiles; vLLM's fresh plan is dropped, the signed
    plan stays byte for byte, and the next boot with enough free memory applies it again (no
    store: a baked-in plan that vLLM overwrote would be lost for good)."""
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    worker = make_worker(plugin, free=55 * GIB)
    fp = fingerprint(plugin, worker)
    data, sig = _signed_local_plan(plugin, keys, fp)
    assert worker.determine_available_memory() == profiled_bytes()
    assert "decision=profile reason=below-baseline" in _decision(lines)
    _finish_boot(plugin, worker, profiled_bytes() - GIB)  # vLLM's save, from its warm-up
    assert (plugin.plan_dir / plan_name(fp)).read_bytes() == data
    assert (plugin.plan_dir / sig_name(fp)).read_bytes() == sig
    (record,) = [r for r in _records(plugin) if r["plan"]["reason"] == "below-baseline"]
    assert record["plan"]["fresh_plan"] == "dropped"
    nxt = make_worker(plugin)
    assert nxt.determine_available_memory() == PLANNED_KV
    assert "decision=apply reason=applied source=local" in _decision(lines)


def test_a_boot_that_could_not_verify_the_signed_plan_never_overwrites_it(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    """Red team 8a: the trusted-keys file was unusable for one boot (rewritten in place by its
    owner, a revocation made and undone): that boot profiled, and vLLM's save wrote its unsigned
    plan over the signed one, beside the old signature. Once the keys were right again, every
    boot refused the node's plan as ``digest-mismatch`` ("altered plan?"), and with no store it
    was lost for good. A boot that cannot sign keeps a signed plan it did not verify."""
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    worker = make_worker(plugin)
    fp = fingerprint(plugin, worker)
    data, sig = _signed_local_plan(plugin, keys, fp)
    trusted = keys.trusted.read_bytes()
    keys.trusted.write_text("# being rewritten\n")
    assert worker.determine_available_memory() == profiled_bytes()
    assert "decision=profile reason=config-error" in _decision(lines)
    _finish_boot(plugin, worker, profiled_bytes() - GIB)  # vLLM's save, from its warm-up
    assert (plugin.plan_dir / plan_name(fp)).read_bytes() == data
    assert (plugin.plan_dir / sig_name(fp)).read_bytes() == sig
    keys.trusted.write_bytes(trusted)
    nxt = make_worker(plugin)
    assert nxt.determine_available_memory() == PLANNED_KV
    assert "decision=apply reason=applied source=local" in _decision(lines)


def test_a_boot_without_trusted_keys_still_saves_over_a_signed_plan(
    plugin: SimpleNamespace, keys: SimpleNamespace, lines: list
) -> None:
    """A bake's profiling boot runs without trusted keys and signs afterwards (``plancache sign
    --replace``): vLLM's fresh plan replaces the old one there, as vLLM saves it, so the bake
    signs what this boot measured (the rule above is for boots that ask for signed plans)."""
    worker = make_worker(plugin, free=55 * GIB)  # below the old plan's baseline: it profiles
    fp = fingerprint(plugin, worker)
    data, _ = _signed_local_plan(plugin, keys, fp)
    assert worker.determine_available_memory() == profiled_bytes()
    assert "decision=profile reason=below-baseline" in _decision(lines)
    _finish_boot(plugin, worker, profiled_bytes() - GIB)
    assert (plugin.plan_dir / plan_name(fp)).read_bytes() != data


def _compiling_runner(worker: Any, counter: str) -> None:
    """The stand-in runner's profile run moves vLLM's own compilation counter as a real
    ``GPUModelRunner.profile_run`` does when it compiles (``num_inductor_compiles``) or loads
    compiled artifacts (``num_compiled_artifacts_loaded``): the GPU work is the stand-in's."""
    from vllm.compilation.counter import compilation_counter

    profile_run = worker.model_runner.profile_run

    def run(randomize_inputs: bool = False) -> None:
        setattr(compilation_counter, counter, getattr(compilation_counter, counter) + 1)
        profile_run(randomize_inputs)

    worker.model_runner.profile_run = run


def test_a_cold_compile_boot_is_not_signed_and_the_warm_boot_after_it_is(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    """Items 1, 2: the cold boot's plan is refused (one WARNING line, vLLM's cold plan removed);
    the next boot profiles warm, and its plan is signed with the evidence; the boot applying it
    records that evidence. ``PLANCACHE_SIGN_COLD=1`` signs a cold one, saying so."""
    monkeypatch.setenv("PLANCACHE_SIGNING_KEY", str(keys.private))
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    cold = make_worker(plugin)
    fp = fingerprint(plugin, cold)
    _compiling_runner(cold, "num_inductor_compiles")
    kv = cold.determine_available_memory() - GIB
    _finish_boot(plugin, cold, kv)
    (warning,) = [r.getMessage() for r in lines if r.levelno == logging.WARNING]
    assert f"plan for {fp} not signed or shared: cold-compile:" in warning
    assert "PLANCACHE_SIGN_COLD=1" in warning
    assert not (plugin.plan_dir / sig_name(fp)).exists()
    assert not (plugin.plan_dir / plan_name(fp)).exists()
    lines.clear()

    warm = make_worker(plugin)
    _compiling_runner(warm, "num_compiled_artifacts_loaded")
    assert warm.determine_available_memory() == profiled_bytes()
    assert "decision=profile reason=no-plan" in _decision(lines)
    _finish_boot(plugin, warm, kv)
    data = (plugin.plan_dir / plan_name(fp)).read_bytes()
    verified = verify_plan(
        plan_name(fp),
        data,
        (plugin.plan_dir / sig_name(fp)).read_bytes(),
        load_keyring(keys.trusted),
        datetime.now(timezone.utc),
    )
    assert verified.statement is not None
    evidence = dict(verified.statement.evidence)
    assert evidence["compile"] == "warm" and evidence["vllm_version"] == "0.33.0"
    assert evidence["torch_version"].startswith("2.13")
    # vLLM's own profiling numbers, as its determine_available_memory left them on the worker
    assert (evidence["weights_memory"], evidence["consumed_memory"]) == (GIB, 2 * GIB)
    assert evidence["peak_activation_memory"] == GIB
    assert evidence["available_kv_cache_memory"] == profiled_bytes()

    applying = make_worker(plugin)
    assert applying.determine_available_memory() == kv
    lines.clear()
    _finish_boot(plugin, applying)
    assert _record_line(lines)["plan"]["evidence"] == evidence

    monkeypatch.setenv("PLANCACHE_SIGN_COLD", "1")
    (plugin.plan_dir / sig_name(fp)).unlink()  # unsigned: the next boot profiles, cold
    forced = make_worker(plugin)
    _compiling_runner(forced, "num_inductor_compiles")
    forced.determine_available_memory()
    _finish_boot(plugin, forced, kv)
    statement = verify_plan(
        plan_name(fp),
        (plugin.plan_dir / plan_name(fp)).read_bytes(),
        (plugin.plan_dir / sig_name(fp)).read_bytes(),
        load_keyring(keys.trusted),
        datetime.now(timezone.utc),
    ).statement
    assert statement is not None and statement.evidence["compile"] == "cold"


def test_impossible_numbers_are_never_signed_with_their_own_reason(
    plugin: SimpleNamespace, keys: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, lines: list
) -> None:
    """Item 2: vLLM's negative suggestion (#57936's large graph pools) is refused at signing."""
    monkeypatch.setenv("PLANCACHE_SIGNING_KEY", str(keys.private))
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    worker = make_worker(plugin)
    fp = fingerprint(plugin, worker)
    worker.determine_available_memory()
    _finish_boot(plugin, worker, -GIB)
    (warning,) = [r.getMessage() for r in lines if r.levelno == logging.WARNING]
    assert f"plan for {fp} not signed or shared: kv-not-positive:" in warning
    assert not (plugin.plan_dir / sig_name(fp)).exists()


KILLED_BOOT = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
import vllm_cpu
vllm_cpu.pin_device()
vllm_cpu.load_plugins_like_vllm()
from vllm.v1.worker import gpu_worker
worker = vllm_cpu.make_worker(gpu_worker.Worker, vllm_cpu.engine_config(Path({model!r})))
print("kv", worker.determine_available_memory(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # after applying, before the warm-up ends
"""


def _killed_boot(env: SimpleNamespace, keys: SimpleNamespace) -> None:
    """A worker process (vLLM's real modules, the plugin loaded as vLLM loads it) that applies
    the node's plan and is SIGKILLed before its ``compile_or_warm_up_model`` returns."""
    import subprocess

    child_env = {
        **os.environ,
        **cpu_environ(env.tmp / "cache"),
        "VLLM_ENABLE_STARTUP_PLAN": "1",
        "PLANCACHE_TRUSTED_KEYS": str(keys.trusted),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    script = KILLED_BOOT.format(tests=str(Path(__file__).parent), model=str(env.model))
    done = subprocess.run(
        [sys.executable, "-c", script], env=child_env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == -9, done.stderr[-2000:]
    assert f"kv {PLANNED_KV}" in done.stdout


@pytest.mark.parametrize("fails", [False, True], ids=["durable", "fsync-fails"])
def test_the_note_is_durable_before_the_kv_cache_is_sized_and_off_the_apply_path(
    plugin: SimpleNamespace,
    keys: SimpleNamespace,
    monkeypatch: pytest.MonkeyPatch,
    lines: list,
    fails: bool,
) -> None:
    """Issue 50 item 7 (b): the note's fsyncs (and the decision's record write) run on a thread
    started at the decision, overlapping vLLM's profile run, and are joined before
    ``determine_available_memory`` returns the number vLLM sizes the KV cache from. Here the
    fsync waits until vLLM's profile run has begun, so it cannot have been on the apply path,
    and must have ended before the method returns. A note that cannot be made durable (EIO): an
    ERROR line naming it, and the boot goes on (a worker's death is still caught)."""
    import errno
    import threading

    from plancache.vllm_plugin.plan_health import notes

    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(keys.trusted))
    worker = make_worker(plugin)
    fp = fingerprint(plugin, worker)
    _signed_local_plan(plugin, keys, fp)
    events: list[str] = []
    profiling = threading.Event()
    make_durable = notes.make_durable

    def durable_after_profiling_began(path: Path, fd: int) -> None:
        assert profiling.wait(10), "the note's fsync blocked the apply path"
        if fails:
            raise OSError(errno.EIO, "Input/output error")
        make_durable(path, fd)
        events.append(f"durable {path.name}")

    def profile_run(randomize_inputs: bool = False) -> None:
        events.append("profile run")
        profiling.set()

    monkeypatch.setattr(notes, "make_durable", durable_after_profiling_began)
    worker.model_runner.profile_run = profile_run
    assert worker.determine_available_memory() == PLANNED_KV
    events.append("returned")
    note = notes.applying_path(plugin.plan_dir, fp)
    errors = [r.getMessage() for r in lines if r.levelno >= logging.ERROR]
    if fails:
        assert events == ["profile run", "returned"]
        assert errors == [
            f"plancache: boot note {note} not made durable: Input/output error; a node reset "
            "before this boot's start-up ends would not be caught"
        ]
    else:
        assert events == ["profile run", f"durable {note.name}", "returned"] and errors == []
    (record,) = _records(plugin)  # the decision's record, written on that thread, then again
    assert record["plan"]["decision"] == "apply" and record["plan"]["determine_ms"] >= 0
    assert note.exists()
    _finish_boot(plugin, worker)
    assert not note.exists()


@pytest.mark.parametrize("profiled_kv", [40 * GIB, 49 * GIB], ids=["too-large", "fine"])
def test_a_boot_killed_after_applying_is_not_a_crash_loop(
    plugin: SimpleNamespace,
    monkeypatch: pytest.MonkeyPatch,
    lines: list,
    profiled_kv: int,
    killed_once: dict[str, bytes],
) -> None:
    """Item 3: the killed boot left its note; the next boot profiles (``unfinished-boot``) and
    compares: a plan over the margin is held back (``plan-exceeds-profile`` until released, an
    alert in the record), a plan within it applies again on the boot after."""
    from plancache.vllm_plugin.plan_health import notes

    trusted = plugin.tmp / "killed.pub"
    trusted.write_bytes(killed_once["ci.pub"])  # the key of the plan the killed boot applied
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(trusted))
    plugin.plan_dir.mkdir(parents=True, exist_ok=True)
    for name, content in killed_once.items():  # the node as the killed boot left it
        if name != "ci.pub":
            (plugin.plan_dir / name).write_bytes(content)
    worker = make_worker(plugin)
    fp = fingerprint(plugin, worker)
    assert notes.applying_path(plugin.plan_dir, fp).exists()
    assert worker.determine_available_memory() == profiled_bytes()
    assert f"decision=profile reason=unfinished-boot source=local fingerprint={fp}" in _decision(
        lines
    )
    _finish_boot(plugin, worker, profiled_kv)
    assert not notes.applying_path(plugin.plan_dir, fp).exists()
    record = _record_line(lines)
    lines.clear()
    nxt = make_worker(plugin)
    if profiled_kv == 40 * GIB:
        assert record["plan"]["held_back"]["plan_kv_cache_memory_bytes"] == PLANNED_KV
        assert record["plan"]["held_back"]["profiled_kv_cache_memory_bytes"] == profiled_kv
        assert any("held back (plan-exceeds-profile)" in w for w in record["warnings"])
        assert nxt.determine_available_memory() == profiled_bytes()
        assert "decision=profile reason=plan-exceeds-profile" in _decision(lines)
        _finish_boot(plugin, nxt)  # every later boot's record still names the plan, both numbers
        later = _record_line(lines)
        lines.clear()
        assert later["plan"]["held_back"]["profiled_kv_cache_memory_bytes"] == profiled_kv
        assert any("held back (plan-exceeds-profile)" in w for w in later["warnings"])
        # the operator's command clears it; the boot after applies the plan again
        from plancache.cli.main import main as cli

        assert cli(["release", fp, "--dir", str(plugin.plan_dir)]) == 0
        again = make_worker(plugin)
        assert again.determine_available_memory() == PLANNED_KV
    else:
        assert record["plan"]["held_back"] is None
        assert nxt.determine_available_memory() == PLANNED_KV
        assert "decision=apply reason=applied" in _decision(lines)
        assert notes.applying_path(plugin.plan_dir, fp).exists()  # until this boot finishes
        monkeypatch.setattr(
            "torch.accelerator.get_memory_info",
            lambda device=None: (GIB // 2, DEVICE_TOTAL),
            raising=False,
        )
        _finish_boot(plugin, nxt)  # item 4: the margin left, flagged below the threshold
        assert not notes.applying_path(plugin.plan_dir, fp).exists()
        margin = _record_line(lines)["plan"]["margin"]
        assert (margin["free_bytes"], margin["tight"]) == (GIB // 2, True)
        assert any("tight plan" in r.getMessage() for r in lines if r.levelno == logging.WARNING)


@pytest.fixture(scope="module")
def killed_once(
    vllm_env: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, bytes]:
    """One real killed boot for the module (each costs a vLLM import): the plan directory it
    left, copied into each test's own."""
    tmp = tmp_path_factory.mktemp("killed")
    key_dir = tmp / "keys"
    key_dir.mkdir()
    signer = generate_keypair(key_dir / "ci", force=False, comment="ci", env={})
    env = SimpleNamespace(tmp=tmp, model=vllm_env.model, plan_dir=tmp / "cache" / "startup_plan")
    keys = SimpleNamespace(signer=signer, trusted=key_dir / "ci.pub")
    with pytest.MonkeyPatch.context() as mp:
        pin_device(functools.partial(mp.setattr, raising=False))
        worker = vllm_cpu.make_worker(vllm_env.Worker, vllm_env.config)
        fp = vllm_env.startup_plan.compute_plan_fingerprint(
            worker.vllm_config, worker.rank, worker.parallel_config.world_size
        )
    write_plan(env.plan_dir, fp, signer)
    _killed_boot(env, keys)
    return {p.name: p.read_bytes() for p in env.plan_dir.iterdir()} | {
        "ci.pub": (key_dir / "ci.pub").read_bytes()
    }


READ_ONLY_BOOTS = """
import contextlib, os, subprocess, sys
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
sys.path.insert(0, {tests!r})
import vllm_cpu
from vllm_cpu import GIB, PLANNED_KV, conditions
vllm_cpu.pin_device()
vllm_cpu.load_plugins_like_vllm()
from vllm.v1.worker import gpu_worker, startup_plan
from plancache.keys.schemes import load_signer
from plancache.trust.plans.plan import Plan, plan_name, render_plan, sig_name
from plancache.trust.signing import sign_plan

@contextlib.contextmanager
def profiling(snapshot, weights_memory=0):  # the stand-in's GPU half, as in this module
    yield SimpleNamespace(total_consumed=2 * GIB, transient_peak_headroom=GIB,
        non_kv_cache_memory={non_kv}, before_create=snapshot,
        after_profile=SimpleNamespace(free_memory=snapshot.free_memory - {non_kv}))

gpu_worker.memory_profiling = profiling
config = vllm_cpu.engine_config(Path({model!r}))
first = vllm_cpu.make_worker(gpu_worker.Worker, config)
fp = startup_plan.compute_plan_fingerprint(first.vllm_config, 0, 1)
plans = Path({plans!r})
data = render_plan(Plan(fp, PLANNED_KV, 60 * GIB))
(plans / plan_name(fp)).write_bytes(data)
signer = load_signer({key!r}, env={{}})
(plans / sig_name(fp)).write_bytes(
    sign_plan(plan_name(fp), data, signer, datetime.now(timezone.utc), provenance=conditions()))
subprocess.run(["mount", "-o", "remount,ro", str(plans)], check=True)
print("first", first.determine_available_memory(), flush=True)  # never finishes its start-up:
from plancache.vllm_plugin.worker_boot import STATE_ATTR
os.close(getattr(first, STATE_ATTR).note_fd)  # it dies (the kernel closes its locked note)
print("second", vllm_cpu.make_worker(gpu_worker.Worker, config).determine_available_memory())
print("fp", fp)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: unshare -m and a read-only tmpfs")
def test_plans_on_a_read_only_mount_apply_and_a_crash_is_still_caught(
    vllm_env: SimpleNamespace, tmp_path: Path
) -> None:
    """Plans shipped on a read-only mount at vLLM's plan directory (an image layer, a ConfigMap):
    a real tmpfs remounted ``ro`` in a mount namespace, booted through vLLM 0.33's worker in a
    process of its own. The first boot applies the plan (its note in the node's state
    directory); it never ends its start-up, so the second profiles (``unfinished-boot``). Red
    team 49: every boot said ``local-error`` (``boot note not written``) and profiled."""
    import subprocess

    from plancache.storage.local.state_dir import state_dir_for
    from plancache.vllm_plugin.plan_health import notes

    key_dir = tmp_path / "keys"
    key_dir.mkdir()
    generate_keypair(key_dir / "ci", force=False, comment="ci", env={})
    cache = tmp_path / "cache"
    plans = cache / "startup_plan"
    plans.mkdir(parents=True)
    script = READ_ONLY_BOOTS.format(
        tests=str(Path(__file__).parent),
        model=str(vllm_env.model),
        plans=str(plans),
        key=str(key_dir / "ci"),
        non_kv=PROFILED_NON_KV,
    )
    child_env = {
        **os.environ,
        **cpu_environ(cache),
        "VLLM_ENABLE_STARTUP_PLAN": "1",
        "PLANCACHE_TRUSTED_KEYS": str(key_dir / "ci.pub"),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "SCRIPT": script,
    }
    child_env.pop("PLANCACHE_STATE_DIR", None)
    mount = f'mount -t tmpfs -o size=1m tmpfs {plans} && exec {sys.executable} -c "$SCRIPT"'
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", mount],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert int(out["first"]) == PLANNED_KV, done.stderr[-2000:]
    assert int(out["second"]) == profiled_bytes()
    assert "reason=unfinished-boot" in done.stdout + done.stderr
    state = state_dir_for(plans, {"VLLM_CACHE_ROOT": str(cache)})
    assert notes.APPLYING.format(fp=out["fp"].strip()) in os.listdir(state)
