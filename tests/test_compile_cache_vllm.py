"""The compile-cache guard against vLLM 0.33's real compile path (the recipe's toy module on CPU).

Two cold boots sign a cache each (module-scoped): the AOT layout (which the plugin also pushes
to a ``file://`` store) and the ``VLLM_USE_AOT_COMPILE=0`` layout. Every scenario then boots in
its own subprocess on a hard-linked copy, two at a time (the machine has two cores): tampered
copies under the guard, the same payloads without it (to show they really run), warm loads,
``VLLM_FORCE_AOT_LOAD=1`` after a quarantine, a CLI store round trip and the plugin's own pull
from a loopback S3 server that counts requests. Each test asserts on one scenario's result: the
payload marker, the decision lines, the quarantine directory and vLLM's compilation counters.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import compile_payloads as P
from compile_attacks import ATTACKS, store_env
from compile_boots import AOT0, ROOT_NAME, boot, cache_dir, quarantined, subject
from compile_tampers import CONTROLS, GUARDED, cli, t0_generated_py, t_rank_pickle
from plancache.pipeline.resolver import utcnow as mf_now
from plancache.pipeline.trust_config import worker_policy
from plancache.trust.compile_cache.manifest_signature import verify_manifest
from store_servers import FaultObject, FaultServer

pytest.importorskip("vllm")
BUCKET_PREFIX = "bucket/fleet"


def keyring_of_file(top: Path) -> Any:
    return worker_policy(str(top / "keys" / "key.pub"), 1).keyring


Job = tuple[Callable[[Path, Path], None] | None, bool, str | None, dict[str, str]]
"""(tamper, guard, source cache ("signed", "signed0" or None for an empty root), extra env)."""


def jobs() -> dict[str, Job]:
    found: dict[str, Job] = {
        f"guarded-{n}": (t, True, "signed", {}) for n, (t, _) in GUARDED.items()
    }
    found.update({f"control-{n}": (GUARDED[n][0], False, "signed", {}) for n in CONTROLS})
    found["warm"] = (None, True, "signed", {})
    found["pulled"] = (None, True, None, {})
    found["plugin-pulled"] = (None, True, None, {})
    found["force-quarantined"] = (t_rank_pickle, True, "signed", {"VLLM_FORCE_AOT_LOAD": "1"})
    found["force-control"] = (None, False, None, {"VLLM_FORCE_AOT_LOAD": "1"})
    found["warm0"] = (None, True, "signed0", AOT0)
    found["guarded0-generated-py"] = (t0_generated_py, True, "signed0", AOT0)
    # Unguarded, inductor reads $TMPDIR; point it at the same (tampered) directory the guard pins.
    found["control0-generated-py"] = (
        t0_generated_py,
        False,
        "signed0",
        {**AOT0, "TORCHINDUCTOR_CACHE_DIR": "{cache}/rank_0_0/inductor_cache"},
    )
    return found


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, compile_zygote: Any) -> dict[str, Any]:
    """Build and sign both layouts once (the AOT one also pushed by the plugin), then boot every
    scenario, two processes at a time."""
    top = tmp_path_factory.mktemp("compile-cache")
    (top / "keys").mkdir()
    key = str(top / "keys" / "key")
    assert cli("keygen", key).returncode == 0
    for name in ("signed", "signed0"):
        (top / name).mkdir()
    # every boot forks from compile_zygote (tests/conftest.py, tests/compile_zygote.py)
    results = _boot_all(top, key)
    results["zygote_leaked"] = compile_zygote.leaked() if compile_zygote is not None else []
    return results


def _boot_all(top: Path, key: str) -> dict[str, Any]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        cold = pool.submit(
            boot,
            top / "signed",
            PLANCACHE_SIGNING_KEY=key,
            PLANCACHE_URL=f"file://{top}/plugin-store",
            PLANCACHE_COMPILE_CACHE_EXPIRES_IN="30d",
        )
        cold0 = pool.submit(boot, top / "signed0", PLANCACHE_SIGNING_KEY=key, **AOT0)
        results: dict[str, Any] = {"cold": cold.result(), "cold0": cold0.result(), "top": top}
    results["signed_files"] = sorted(
        p.relative_to(top / "signed") for p in (top / "signed").rglob("*")
    )
    results["signed0_files"] = sorted(
        p.relative_to(top / "signed0") for p in (top / "signed0").rglob("*")
    )
    results["signed"] = top / "signed"
    server = FaultServer()  # serves what the plugin pushed, and counts every request
    for prefix in [BUCKET_PREFIX] + [p for _, p in ATTACKS.values() if p]:
        for f in (top / "plugin-store").rglob("*.tar*"):
            key_name = f"{prefix.split('/', 1)[1]}/{f.relative_to(top / 'plugin-store').as_posix()}"
            server.state.objects[key_name] = FaultObject(f.read_bytes())

    def scenario(
        name: str,
        tamper: Callable[[Path, Path], None] | None,
        guard: bool,
        source: str | None,
        env: dict[str, str],
    ) -> dict[str, Any]:
        base = top / name
        base.mkdir()
        marker = base / "marker"
        if name == "pulled":  # push the signed cache to a store, pull it into an empty root
            store = f"file://{top}/store"
            pushed = cli(
                "compile-cache",
                "push",
                "--json",
                "--key",
                key,
                "--url",
                store,
                "--cache",
                subject(top / "signed"),
                str(top / "signed" / ROOT_NAME),
            )
            pulled = cli(
                "compile-cache",
                "pull",
                "--json",
                "--trusted-keys",
                key + ".pub",
                "--url",
                store,
                str(base / ROOT_NAME),
            )
            assert pushed.returncode == 0 and pulled.returncode == 0, (
                pushed.stdout + pushed.stderr + pulled.stdout + pulled.stderr
            )
        if name == "plugin-pulled":  # the plugin pulls at first read, from loopback S3
            env = {**env, **store_env(server.endpoint, BUCKET_PREFIX)}
        if source is not None:
            P.link_copy(top / source / ROOT_NAME, base / ROOT_NAME)
            # the header torch would have from an earlier boot (not what a control shows)
            if not guard:
                P.seed_torch_headers(
                    top / source / ROOT_NAME / "plancache-private" / "headers", base / "tmp"
                )
        aot = source != "signed0"
        if tamper is not None:
            tamper(cache_dir(base, aot), marker)
        if source is not None:
            env = {k: v.replace("{cache}", str(cache_dir(base, aot))) for k, v in env.items()}
        report = boot(base, guard, **env)
        report["marker"] = marker.read_text() if marker.exists() else None
        report["quarantine"] = quarantined(base)
        report["base"] = base
        return report

    def attack(name: str) -> dict[str, Any]:
        run, prefix = ATTACKS[name]
        base = top / name
        base.mkdir()
        try:
            report = run(top, base, store_env(server.endpoint, prefix) if prefix else {})
        except Exception as exc:
            return {
                "setup_error": f"{type(exc).__name__}: {exc}",
                "correct": False,
                "decisions": [],
                "stderr": "",
                "base": base,
                "marker": None,
            }
        marker = base / "marker"
        report.update(marker=marker.read_text() if marker.exists() else None, base=base)
        report.setdefault("quarantine", quarantined(base))
        return report

    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {name: pool.submit(scenario, name, *job) for name, job in jobs().items()}
            futures.update({name: pool.submit(attack, name) for name in ATTACKS})
            results.update({name: f.result() for name, f in futures.items()})
    finally:
        server.stop()
    results["requests"] = server.state.requests
    return results


def test_cold_boot_compiles_and_signs_with_pinned_dirs(runs: dict[str, Any]) -> None:
    cold = runs["cold"]
    assert cold["correct"] and cold["counters"]["num_aot_compiles"] == 1
    assert ("compile", "no-cache") in cold["decisions"]
    assert any(str(p).endswith(".plancache.sig") for p in runs["signed_files"])
    # Fresh HOME and TMPDIR: torch put nothing it reads back there (its caches, the precompiled
    # header included, went to the boot's private directory, removed at exit, and the header
    # was not signed into the cache: every node rebuilds it privately if it ever compiles).
    outside = [
        p
        for p in runs["signed_files"]
        if p.parts[0] in ("home", "tmp") and (runs["signed"] / p).is_file()
    ]
    assert outside == [], outside
    # nor in the HOME and TMPDIR the boots forked from
    assert runs["zygote_leaked"] == [], runs["zygote_leaked"]
    signed = [p for p in runs["signed_files"] if p.parts[:2] == (ROOT_NAME, "torch_compile_cache")]
    assert signed and not any("precompiled_headers" in str(p) for p in signed)
    # copies removed
    assert [p.name for p in (runs["signed"] / ROOT_NAME / "plancache-private").iterdir()] == [
        "headers"
    ]
    # Signed with the configured expiry, and the sign and the push each logged at INFO.
    sig = (
        cache_dir(runs["signed"]).parent / (cache_dir(runs["signed"]).name + ".plancache.sig")
    ).read_bytes()
    manifest = verify_manifest(subject(runs["signed"]), sig, keyring_of_file(runs["top"]), mf_now())
    assert manifest.manifest.expires_at - manifest.manifest.signed_at == timedelta(days=30)
    assert "plancache: compile-cache signed cache=torch_aot_compile/" in cold["stderr"]
    assert "plancache: compile-cache pushed cache=torch_aot_compile/" in cold["stderr"]
    # The plugin's background push finished before the process exited: one archive, one signature,
    # then the precompiled header this compile used, compressed, with its own signature.
    store = runs["top"] / "plugin-store" / "torch_compile_cache" / "torch_aot_compile"
    name = cache_dir(runs["signed"]).name
    assert sorted(p.name for p in store.iterdir()) == sorted(
        f"{name}{s}" for s in (".tar", ".tar.sig", ".pch.gz", ".pch.gz.sig")
    )


def test_signed_cache_loads_warm_and_stays_valid(runs: dict[str, Any]) -> None:
    warm = runs["warm"]
    assert warm["correct"] and warm["counters"]["num_aot_artifacts_loaded"] == 1
    assert warm["counters"]["num_aot_compiles"] == 0 and warm["decisions"] == [("load", "verified")]
    assert warm["marker"] is None and warm["quarantine"] == []
    # Whatever torch wrote during the warm load, the next boot still accepts the cache.
    result = cli(
        "compile-cache",
        "verify",
        "--json",
        "--cache",
        cache_dir(warm["base"])
        .relative_to(warm["base"] / ROOT_NAME / "torch_compile_cache")
        .as_posix(),
        "--trusted-keys",
        str(warm["base"].parent / "keys" / "key.pub"),
        str(warm["base"] / ROOT_NAME),
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", sorted(GUARDED))
def test_tampered_cache_is_quarantined_and_recompiled(runs: dict[str, Any], name: str) -> None:
    run = runs[f"guarded-{name}"]
    assert run["marker"] is None, f"payload ran under the guard: {run['marker']}"
    assert run["decisions"][0] == ("quarantined", GUARDED[name][1]), run["decisions"]
    assert any(q.endswith("-" + GUARDED[name][1]) for q in run["quarantine"]), run["quarantine"]
    assert run["counters"]["num_aot_compiles"] == 1 and run["correct"], run["error"]
    if name == "oversize":  # refused from its size alone: 4 GiB were never read or hashed
        assert run["elapsed_ms"][0] < 2000, run["elapsed_ms"]


@pytest.mark.parametrize("name", CONTROLS)
def test_payload_really_runs_without_the_guard(runs: dict[str, Any], name: str) -> None:
    run = runs[f"control-{name}"]
    if run["marker"] is None:
        pytest.xfail(f"vLLM 0.33 on CPU did not execute the {name} payload in this scenario")
    assert run["decisions"] == []


def test_push_pull_into_an_empty_root_loads_warm(runs: dict[str, Any]) -> None:
    pulled = runs["pulled"]
    assert pulled["decisions"] == [("load", "verified")]
    assert (
        pulled["counters"]["num_aot_artifacts_loaded"] == 1
        and pulled["counters"]["num_aot_compiles"] == 0
    )
    assert pulled["correct"]
    store = pulled["base"].parent / "store" / "torch_compile_cache" / "torch_aot_compile"
    # one archive and its signature
    assert sorted(p.suffix for p in store.iterdir()) == [".sig", ".tar"]


def cache_and_header_reads(requests: list[tuple[str, str]], archive: str) -> bool:
    """One GET of the archive and one of its signature, then the shipped header's companion: its
    signature once (the rank that pulled), and its object at most once (not when the node's
    private headers directory already holds every header it names)."""
    header = archive.removesuffix(".tar") + ".pch.gz"
    cache = sorted(r for r in requests if not r[1].startswith(header))
    headers = sorted(r for r in requests if r[1].startswith(header))
    return cache == [("GET", archive), ("GET", archive + ".sig")] and headers in (
        [("GET", header + ".sig")],
        [("GET", header), ("GET", header + ".sig")],
    )


def test_plugin_pull_at_first_read_is_one_archive_get_and_loads_warm(runs: dict[str, Any]) -> None:
    """What the cold boot's plugin pushed, its pull on an empty root fetches with two GETs."""
    run = runs["plugin-pulled"]
    assert run["decisions"] == [("load", "verified")] and "store: pulled" in run["stderr"], run[
        "stderr"
    ][-2000:]
    assert (
        run["counters"]["num_aot_artifacts_loaded"] == 1
        and run["counters"]["num_aot_compiles"] == 0
    )
    assert run["correct"] and run["quarantine"] == []
    name = f"/{BUCKET_PREFIX}/torch_compile_cache/{subject(runs['signed'])}.tar"
    ours = [
        (method, path)
        for method, path, _ in runs["requests"]
        if path.startswith(f"/{BUCKET_PREFIX}/")
    ]
    assert cache_and_header_reads(ours, name)


def test_force_aot_load_after_a_quarantine_fails_as_vllm_does(runs: dict[str, Any]) -> None:
    """``VLLM_FORCE_AOT_LOAD=1``: the quarantined cache is simply absent, so vLLM raises exactly
    what it raises on an empty root, and the payload never runs."""
    run, control = runs["force-quarantined"], runs["force-control"]
    assert run["marker"] is None and run["decisions"][0] == ("quarantined", "digest-mismatch")
    assert not run["correct"] and run["counters"]["num_aot_compiles"] == 0
    assert (run["error"] or "").startswith("FileNotFoundError") and "rank_0_0/model" in run[
        "error"
    ], run["error"]
    private = re.compile(r"\S*/rank_0_0/model")  # vLLM was handed the (empty) private copy's path
    assert private.sub("MODEL", run["error"]) == private.sub("MODEL", control["error"])
    assert "plancache-private/boot-" in run["error"], run["error"]


def test_aot_compile_0_layout_signs_loads_warm_and_stays_valid(runs: dict[str, Any]) -> None:
    cold, warm = runs["cold0"], runs["warm0"]
    assert cold["correct"] and cold["counters"]["num_compiled_artifacts_saved"] == 1
    assert (
        cold["counters"]["num_aot_compiles"] == 0 and ("compile", "no-cache") in cold["decisions"]
    )
    files = runs["signed0_files"]
    assert any(
        str(p).endswith(".plancache.sig") and "torch_aot_compile" not in str(p) for p in files
    )
    # Inductor's own cache was pinned inside the signed <10 hex>/rank_0_0/, not left in $TMPDIR.
    assert [
        p
        for p in files
        if p.parts[0] in ("home", "tmp") and (runs["top"] / "signed0" / p).is_file()
    ] == []
    assert any(p.match("*/rank_0_0/inductor_cache/fxgraph/*") for p in files)
    assert (
        warm["decisions"] == [("load", "verified")] and warm["correct"] and warm["quarantine"] == []
    )
    assert (
        warm["counters"]["num_compiled_artifacts_loaded"] == 1
        and warm["counters"]["num_inductor_compiles"] == 0
    )
    assert "/plancache-private/boot-" in warm["inductor_cache_dir"], warm["inductor_cache_dir"]
    assert warm["inductor_cache_dir"].endswith("/rank_0_0/inductor_cache")
    result = cli(
        "compile-cache",
        "verify",
        "--json",
        "--cache",
        subject(warm["base"], aot=False),
        "--trusted-keys",
        str(runs["top"] / "keys" / "key.pub"),
        str(warm["base"] / ROOT_NAME),
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_aot_compile_0_tampered_module_is_quarantined_and_recompiled(runs: dict[str, Any]) -> None:
    control, run = runs["control0-generated-py"], runs["guarded0-generated-py"]
    assert control["marker"] == "py\n" and control["counters"]["num_compiled_artifacts_loaded"] == 1
    assert run["marker"] is None, f"payload ran under the guard: {run['marker']}"
    assert run["decisions"][0] == ("quarantined", "digest-mismatch"), run["decisions"]
    assert any(q.endswith("-digest-mismatch") for q in run["quarantine"]), run["quarantine"]
    assert run["counters"]["num_inductor_compiles"] == 1 and run["correct"], run["error"]


# Issue 17: the guard against a local writer, every vLLM setting, real mounts, links, ranks.


def attack_run(runs: dict[str, Any], name: str) -> dict[str, Any]:
    run = runs[name]
    assert "setup_error" not in run, run.get("setup_error")
    return run


def test_a_rewrite_at_the_moment_vllm_reads_never_reaches_torch(runs: dict[str, Any]) -> None:
    """The hard-linked ``rank_0_0/model`` verified, then its inode was rewritten with a payload
    after vLLM opened the file: vLLM had opened the private copy, which holds the verified bytes."""
    run = attack_run(runs, "rewrite-at-read")
    assert run["outside_is_payload"] and run["read_path"] is not None, "the local writer never ran"
    assert run["marker"] is None, f"payload ran: {run['marker']}"
    assert run["decisions"][0] == ("load", "verified"), run["decisions"]
    assert "/plancache-private/boot-" in run["read_path"], run["read_path"]
    assert (
        run["counters"]["num_aot_artifacts_loaded"] == 1
        and run["counters"]["num_aot_compiles"] == 0
    )
    assert run["correct"], run["error"]


def test_vllm_cache_disabled_logs_a_decision_and_reads_no_shared_tmpdir_cache(
    runs: dict[str, Any],
) -> None:
    control, run = (
        attack_run(runs, "disabled-planted-control"),
        attack_run(runs, "disabled-planted"),
    )
    assert control["marker"] == "py\n", "the planted $TMPDIR entry does not run without the guard"
    assert run["marker"] is None, f"payload ran under the guard: {run['marker']}"
    assert ("compile", "vllm-cache-disabled") in run["decisions"], run["decisions"]
    assert "/plancache-private/boot-" in run["inductor_cache_dir"] and run["correct"], run


def test_a_cache_volume_on_its_own_mount_quarantines_there_and_compiles(
    runs: dict[str, Any],
) -> None:
    run = attack_run(runs, "own-mount")
    if "skipped" in run:
        pytest.skip(run["skipped"])
    assert run["marker"] is None and run["decisions"][0] == ("quarantined", "digest-mismatch"), run[
        "decisions"
    ]
    assert any(q.endswith("-digest-mismatch") for q in run["quarantine_here"]), run[
        "quarantine_here"
    ]
    assert run["counters"]["num_aot_compiles"] == 1 and run["correct"], run["error"]


def test_a_valid_signed_cache_on_a_read_only_mount_loads(runs: dict[str, Any]) -> None:
    run = attack_run(runs, "read-only-mount")
    if "skipped" in run:
        pytest.skip(run["skipped"])
    assert run["decisions"][0] == ("load", "verified"), (run["decisions"], run["stderr"][-2000:])
    assert (
        run["counters"]["num_aot_artifacts_loaded"] == 1
        and run["counters"]["num_aot_compiles"] == 0
    ), run["counters"]
    assert run["correct"], run["error"]


def test_a_read_only_root_with_a_noexec_tmp_loads_from_the_configured_private_dir(
    runs: dict[str, Any],
) -> None:
    run = attack_run(runs, "private-dir-setting")
    if "skipped" in run:
        pytest.skip(run["skipped"])
    assert run["decisions"][0] == ("load", "verified"), (run["decisions"], run["stderr"][-2000:])
    assert run["inductor_cache_dir"].startswith(run["private_dir"] + "/boot-"), run[
        "inductor_cache_dir"
    ]
    assert (
        run["counters"]["num_aot_artifacts_loaded"] == 1
        and run["counters"]["num_aot_compiles"] == 0
    ), run["counters"]
    assert run["correct"], run["error"]


def test_planted_symlinks_are_never_followed(runs: dict[str, Any]) -> None:
    run = attack_run(runs, "planted-links")
    assert run["victim"] == b"victim\n" and run["outside"] == [], (run["victim"], run["outside"])
    assert run["marker"] is None and run["correct"], run["error"]
    assert run["decisions"][0] == ("quarantined", "digest-mismatch"), run["decisions"]
    # beside it instead
    assert any(q.endswith("-digest-mismatch") for q in run["quarantine"]), run["quarantine"]
    # the linked lock of <10 hex>
    assert ("compile", "unsafe-directory") in run["decisions"], run["decisions"]
    assert "plancache: compile-cache signed cache=torch_aot_compile/" in run["stderr"], run[
        "stderr"
    ][-2000:]


def test_two_ranks_pull_once_and_a_restart_makes_no_store_request(runs: dict[str, Any]) -> None:
    run = attack_run(runs, "two-ranks")
    for rank in run["ranks"] + [run["restart"]]:
        assert rank["decisions"] == [("load", "verified")], rank["decisions"]
        assert rank["counters"]["num_aot_artifacts_loaded"] == 1 and rank["correct"], rank["error"]
    ours = [(m, p) for m, p, _ in runs["requests"] if p.startswith("/bucket/ranks/")]
    name = f"/bucket/ranks/torch_compile_cache/{subject(runs['signed'])}.tar"
    assert cache_and_header_reads(ours, name), ours
    assert run["quarantine"] == []


def test_a_quarantined_local_cache_is_pulled_again_from_the_store(runs: dict[str, Any]) -> None:
    run = attack_run(runs, "repull")
    assert run["marker"] is None and run["decisions"] == [("load", "verified")], run["decisions"]
    assert 'quarantined_to="' in run["stderr"] and "store: pulled" in run["stderr"]
    assert run["counters"]["num_aot_artifacts_loaded"] == 1 and run["correct"], run["error"]
