"""Fixtures shared by the whole suite: keys, plans written as vLLM writes them, a clock."""

from __future__ import annotations

import gc
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from plancache.trust.keyring.keys import Ed25519Signer, Keyring, TrustedKey
from plancache.trust.plans.plan import Plan, plan_name, render_plan
from plancache.trust.result import PlanResult
from plancache.trust.signing import sign_plan

FP = "0123456789abcdef"
GIB = 2**30
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=timezone.utc)


def make_signer() -> Ed25519Signer:
    return Ed25519Signer(Ed25519PrivateKey.generate())


def keyring_of(*signers: Ed25519Signer, threshold: int = 1, **windows: datetime) -> Keyring:
    keys = {
        s.keyid: TrustedKey(s.keyid, f"key{i}", s.public, windows.get("valid_after"), windows.get("valid_before"))
        for i, s in enumerate(signers)
    }
    return Keyring(keys, frozenset(), threshold)


def raw(result: "PlanResult") -> tuple[bytes | None, bytes | None]:
    """A store's result as (plan bytes, sidecar bytes); its error raised, as a caller would see it."""
    if result.error is not None:
        raise result.error
    return result.plan_bytes, result.sig_bytes


def plan_bytes(fp: str = FP, kv: int = 20 * GIB, baseline: int = 70 * GIB) -> bytes:
    return render_plan(Plan(fp, kv, baseline))


@pytest.fixture
def signer() -> Ed25519Signer:
    return make_signer()


@pytest.fixture
def signed(signer: Ed25519Signer) -> tuple[str, bytes, bytes]:
    """(name, plan bytes, sidecar bytes) for plan FP signed at NOW by ``signer``."""
    data = plan_bytes()
    return plan_name(FP), data, sign_plan(plan_name(FP), data, signer, NOW, expires_at=NOW + timedelta(days=30))


@pytest.fixture
def plan_dir(tmp_path: Path) -> Path:
    path = tmp_path / "vllm" / "startup_plan"
    path.mkdir(parents=True)
    return path


WriteSigned = Callable[..., tuple[bytes, bytes]]


@pytest.fixture(scope="session")
def compile_zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One fork server for every boot of tests/compile_toy.py in this process (tests/compile_zygote.py),
    started by the first test that asks for it: test_compile_cache_vllm's 35 boots, test_boot_records'
    two and test_compile_cache_cli's one then pay for importing torch and vLLM once, not once per
    file. None under ``COMPILE_TOY_FRESH=1`` (fresh interpreters)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:  # not imported here: the zygote imports it
        pytest.skip("vLLM is not installed")
    from compile_boots import start_zygote, stop_zygote

    zygote = start_zygote(tmp_path_factory.mktemp("compile-zygote"))
    try:
        yield zygote
    finally:
        stop_zygote()


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (vLLM's and torch's modules among them, in every xdist worker)
    lives until the process ends: collected once and frozen out of the collector's reach, so the
    full collections that tests set off scan only what tests made. Unfrozen, one took 0.6-0.8 s
    of CPU in a worker that had imported vLLM, and landed inside a bound test's timed boot
    (docs/test-suite.md, 2026-12-05)."""
    _freeze_heap()


def _freeze_heap() -> None:
    """Collect what is garbage now, then move everything left out of the collector's reach."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True, scope="module")
def _deadline_file_starts_frozen(request: pytest.FixtureRequest) -> None:
    """A deadline file starts with what the worker's earlier files left collected and frozen
    (one full collection a file, ~0.5 s): full collections inside its bound tests then scan only
    what the file made. Measured over a run (2026-12-05): without it, 0.35-0.49 s collections in
    the plugin's, the store faults', the direct reads' and the bounds' tests; with it, none over
    0.35 s there. The boot storm's own 24 store clients still make 1.3-2 s ones inside its tests,
    which bound counts, not time (a 10 s budget)."""
    if request.path.name in DEADLINE_FILES:
        _freeze_heap()


# -- scheduling: the longest files first ------------------------------------------------------------

VLLM_FILES = ("test_engine_e2e.py", "test_compile_cache_vllm.py", "test_vllm_ranks.py")
"""The files that boot vLLM for minutes (module fixtures): first in :data:`FIRST`, on their own
workers, and no worker past :data:`BASE_WORKERS` takes a file while one of them is unfinished."""
FIRST = (
    *VLLM_FILES,
    # quick files: pytest-xdist queues a second file on a worker once its first is nearly done
    "test_import_graph.py", "test_storage_local.py", "test_untrusted_text.py",
    # the longest of the rest (mostly waiting: black holes, servers, journeys in subprocesses)
    "test_no_secret_printed.py", "test_boot_records.py", "test_trust_verify.py", "test_cli_fingerprint.py",
    "test_compile_cache_cli.py", "test_install_resolution.py", "test_store_backends.py",
)
DEADLINE_FILES = (
    # the files whose tests assert a wall-time bound (a budget plus a grace): queued after FIRST,
    # so that they never run beside the vLLM fixtures; no more than BASE_WORKERS of them at once,
    # the other worker taking the quick files behind them meanwhile (tests/held_workers.py); the
    # longest first (seconds on three workers, 2026-12-03), so that the last to end are short ones
    "test_store_faults.py",  # 46
    "test_store_bounds.py",  # 43
    "test_store_hostile.py",  # 36
    "test_boot_storm.py",  # 27
    "test_store_scripts.py",  # 24
    "test_vllm_plugin.py",  # 14
    "test_store_azure.py",  # 12
    "test_keys_awskms.py",  # 10
    "test_s3_direct.py",  # 10
    "test_keys_gcpkms.py",  # < 8
)


BASE_WORKERS = 2
"""Workers that start at once; the others (``-n 3`` and more) wait for the vLLM files (tests/held_workers.py)."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadfile":
        return None  # xdist's own
    from held_workers import HeldBackLoadFile
    return HeldBackLoadFile(config, log, base=BASE_WORKERS, heavy=frozenset(VLLM_FILES), deadline=frozenset(DEADLINE_FILES))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files in :data:`FIRST`'s order, then :data:`DEADLINE_FILES`, then the others as collected.
    Under ``--dist loadfile --no-loadscope-reorder`` (scripts/run-tests.sh) pytest-xdist hands files
    to workers in this order (but for a third deadline file at once, which waits behind the
    quick files), so the files that boot vLLM for minutes start first instead of last, and the
    quick files fill the cores beside the deadline files; in one process it only changes the
    order of files, never of a file's tests. Deterministic, as xdist requires (every worker must
    collect the same order)."""
    order = (*FIRST, *DEADLINE_FILES)
    rank = {name: i for i, name in enumerate(order)}
    items.sort(key=lambda item: rank.get(item.path.name, len(order)))  # stable: a file's own order is kept
