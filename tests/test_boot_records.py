"""Boot records on the compile-cache side, on vLLM 0.33's real compile modules (CPU; issue 20).

No compile: one subprocess (torch and the guard pin process-wide caches) installs the guard on
vLLM's real ``vllm.compilation`` modules, then (1) a tampered cache is quarantined and (2) a
signed cache whose artifact vLLM's own ``_try_load_aot_compiled_fn`` cannot load (as when it
was built by another torch) is handed over verified, vLLM falls back to compiling, and the record
says "verified but unused" with the factor that differs (the code hash vLLM wrote for the graph
it compiled instead). With only the compile-cache guard on, the guard itself hooks vLLM's real
``Worker.compile_or_warm_up_model`` to end the record. The plan-side paths (apply, profile, store
down) are in test_vllm_plugin.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from plancache.keys.keyfile import generate_keypair
from vllm_cpu import cpu_environ

SRC = Path(__file__).resolve().parent.parent / "src"

SCRIPT = r"""
import json, logging, os, sys
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

records = []
class Keep(logging.Handler):
    def emit(self, r): records.append((r.levelname, r.getMessage()))
logging.getLogger("vllm.plancache").addHandler(Keep())
logging.getLogger("vllm.plancache").setLevel(logging.INFO)

from plancache.keys.keyfile import file_signer
from plancache.pipeline.compile_cache import flows as cc
from plancache.pipeline.compile_cache.local_caches import CacheRoot
from plancache.vllm_plugin import record
from plancache.vllm_plugin.compile_cache import decisions as compile_decisions
from plancache.vllm_plugin.compile_cache import guard as compile_guard

assert compile_guard.install()
from vllm.compilation import decorators
from vllm.v1.worker import gpu_worker  # a worker process has its worker class imported by now
from vllm.config import DeviceConfig, VllmConfig

root = CacheRoot(Path(os.environ["VLLM_CACHE_ROOT"]))
signer = file_signer(Path(sys.argv[1]), {}, None)
now = datetime.now(timezone.utc)
factors = {
    "env": {"VLLM_PLUGINS": None},
    "config_hash": "abcdef0123",
    "code_hash": "1" * 64,
    "compiler_hash": "2" * 64,
}

def cache(subject, model_bytes):
    private = root.root / ("private-" + subject[-6:])
    (private / "rank_0_0").mkdir(parents=True)
    (private / "rank_0_0" / "model").write_bytes(model_bytes)
    (private / "inductor_cache").mkdir()
    (private / "inductor_cache" / "entry").write_bytes(b"kernel")
    out = cc.publish_cache(
        root, subject, private, signer, now,
        key_factors=factors, measurements={"compile_ms": 20000.0},
    )
    assert out.action == "signed", out
    return root.directory(subject)

# (1) tampered after signing: quarantined
bad = cache("torch_aot_compile/" + "a" * 64, b"model")
(bad / "rank_0_0" / "model").write_bytes(b"MODEL")
compile_guard.private_for(bad)

# (2) verified, handed over, and vLLM's own loader fails on it: it compiles anyway
good = cache("torch_aot_compile/" + "b" * 64, b"not a torch artifact")
vc = VllmConfig(device_config=DeviceConfig(device="cpu"))
model = SimpleNamespace(
    vllm_config=vc, compilation_config=vc.compilation_config, _is_encoder=False, _compile_tag="",
    forward=lambda *a: None, save_aot_compiled_function=lambda: None,
)
loaded = decorators._try_load_aot_compiled_fn(model, str(good / "rank_0_0" / "model"))
assert loaded is None
# the recompile's VllmBackend writes its factors; the guard reads them after the backend returns
debug = root.root / "torch_compile_cache" / "0123456789" / "rank_0_0" / "backbone"
debug.mkdir(parents=True)
(debug / "cache_key_factors.json").write_text(json.dumps({**factors, "code_hash": "3" * 64}))
compile_decisions.note_factors(str(debug))
# the boot ends: vLLM's real Worker.compile_or_warm_up_model, wrapped by the guard (no plan
# side here)
worker = object.__new__(gpu_worker.Worker)
worker.use_v2_model_runner = False
worker._compile_or_warm_up_model = lambda: None
worker.compile_or_warm_up_model()
print(json.dumps({"records": records}))
"""


def test_quarantine_and_a_verified_cache_vllm_did_not_use_are_recorded(tmp_path: Path) -> None:
    key = generate_keypair(tmp_path / "ci", force=False, comment="ci", env={})
    assert key is not None
    env = {
        **os.environ,
        **cpu_environ(tmp_path / "cache"),
        "PYTHONPATH": str(SRC),
        "PLANCACHE_TRUSTED_KEYS": str(tmp_path / "ci.pub"),
        "VLLM_LOGGING_STREAM": "ext://sys.stderr",
    }
    for name in ("PLANCACHE_URL", "PLANCACHE_SIGNING_KEY", "VLLM_FORCE_AOT_LOAD"):
        env.pop(name, None)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "ci")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    logged = json.loads(out.stdout.strip().splitlines()[-1])["records"]
    ((level, line),) = [(lvl, msg) for lvl, msg in logged if "boot-record " in msg]
    doc = json.loads(line.split("boot-record ", 1)[1])
    files = sorted((tmp_path / "cache" / "plancache" / "boot").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text()) == doc and doc["final"] is True
    quarantined, unused = doc["compile_cache"]
    assert quarantined["decision"] == "quarantined" and quarantined["reason"] == "digest-mismatch"
    assert (unused["decision"], unused["reason"], unused["used"]) == ("load", "verified", False)
    assert [s["name"] for s in unused["signed_by"]] == ["ci"]  # who signed what was loaded
    assert unused["signed_by"][0]["keyid"].startswith("SHA256:")
    assert quarantined["signed_by"] == []  # nothing verified, nobody named
    assert unused["differing_factors"] == [
        {"input": "code_hash", "signed": "1" * 64, "here": "3" * 64}
    ]
    assert level == "WARNING" and doc["warnings"] == [
        f"compile cache {unused['cache']} was verified but vLLM did not use it (differs in "
        "code_hash)"
    ]
    assert doc["saved_ms"]["compile"] is None  # nothing was saved: it compiled


def test_a_real_aot_build_signs_vllms_factors_and_a_warm_boot_records_the_compile_it_saved(
    tmp_path: Path, compile_zygote: Any
) -> None:
    """Two boots of vLLM 0.33's real compile path (tests/compile_toy.py, forked from the session's
    zygote like test_compile_cache_vllm's; fresh under ``COMPILE_TOY_FRESH=1``): the build signs the
    cache-key factors vLLM wrote for the graph it compiled and how long the compile took; a node
    that loads the cache records that vLLM used it and the time saved."""
    import shutil
    from datetime import datetime, timezone

    from compile_boots import ROOT_NAME, boot, cache_dir
    from plancache.pipeline.compile_cache.local_caches import read_sidecar
    from plancache.pipeline.trust_config import worker_policy
    from plancache.trust.compile_cache.manifest_signature import verify_manifest

    (tmp_path / "keys").mkdir()
    generate_keypair(tmp_path / "keys" / "key", force=False, comment="ci", env={})
    build, serve = tmp_path / "build", tmp_path / "serve"
    build.mkdir()
    serve.mkdir()
    built = boot(build, PLANCACHE_SIGNING_KEY=str(tmp_path / "keys" / "key"))
    assert built["counters"]["num_aot_compiles"] == 1 and built["correct"], built["stderr"][-2000:]
    directory = cache_dir(build)
    subject = directory.relative_to(build / ROOT_NAME / "torch_compile_cache").as_posix()
    keyring = worker_policy(str(tmp_path / "keys" / "key.pub"), 1).keyring
    manifest = verify_manifest(
        subject, read_sidecar(directory), keyring, datetime.now(timezone.utc)
    ).manifest
    factors = manifest.key_factors
    assert factors is not None and set(factors) == {
        "env",
        "config_hash",
        "code_hash",
        "compiler_hash",
        "hmac_salt",
    }
    assert (
        "VLLM_USE_AOT_COMPILE" in factors["env"]
        and manifest.measurements
        and manifest.measurements["compile_ms"] > 0
    )
    shutil.copytree(
        build / ROOT_NAME / "torch_compile_cache",
        serve / ROOT_NAME / "torch_compile_cache",
        ignore=shutil.ignore_patterns("*.plancache.lock"),
    )
    warm = boot(serve)
    assert warm["counters"]["num_aot_artifacts_loaded"] == 1 and warm["decisions"] == [
        ("load", "verified")
    ]
    (record,) = [
        json.loads(p.read_text()) for p in (serve / ROOT_NAME / "plancache" / "boot").glob("*.json")
    ]
    (entry,) = record["compile_cache"]
    assert (entry["cache"], entry["decision"], entry["used"]) == (subject, "load", True)
    assert record["saved_ms"]["compile"] is not None and record["saved_ms"]["compile"] >= 0
    assert record["plan"] is None and record["warnings"] == []
