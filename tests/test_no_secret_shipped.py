"""No secret leaves the node (issue 40): what a store holds never carries the node's environment.

vLLM writes every environment variable it hashes into ``cache_key_factors.json`` in the clear:
host names, paths, URLs with credentials. A manifest goes to a shared bucket, so the archive
leaves vLLM's debug files out and the signed factors keep in the clear only an allow-list of
compile settings; every other value is redacted, then keyed (HMAC-SHA256) under a salt the
manifest signs. Each test plants secrets under many spellings and greps every object of a
``file://`` store: raw, archives' members read, sidecars' payloads decoded, gzip inflated.
One test runs vLLM 0.33's real compile path in the ``VLLM_USE_AOT_COMPILE=0`` layout (one cold
boot, ~15-30 s); the others need no vLLM.

Issue 46: torch copies every variable named with TORCH, DYNAMO, INDUCTOR or TRITON into what it
compiles. Two more cold boots (one per layout, ``VLLM_USE_AOT_COMPILE=0`` and the AOT default)
plant a remote cache URL with userinfo, an API token, a Kubernetes-style
``TRITON_INFERENCE_SERVER_PORT=tcp://10.…`` (and its IPv6 form), a token, a passphrase and a
Bearer header under names without a ``_TOKEN``-style suffix, and a profiler directory under the
boot's home: torch
writes them into the local cache, the push is refused (``private-data``) naming each, never a
value, and the store holds none of them; a clean AOT boot still pushes cache and header.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import re
import sys
import tarfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from conftest import NOW, keyring_of, make_signer
from plancache.pipeline.compile_cache import flows as cc
from plancache.pipeline.compile_cache.local_caches import CacheRoot, verify_cache
from plancache.pipeline.compile_cache.manifest_building import factors_of
from plancache.storage.store import open_store
from plancache.trust.compile_cache.manifest import Manifest, parse_manifest
from plancache.trust.compile_cache.manifest_signature import sign_manifest, verify_manifest
from plancache.trust.display import redact, safe_text
from plancache.trust.inputs import (
    CLEAR_ENV,
    KEYED,
    SALT_KEY,
    differences,
    keyed,
    keyed_factors,
    new_salt,
    without_secrets,
)

SIGNER = make_signer()
KEYRING = keyring_of(SIGNER)
SUBJECT = "0123456789"

VLLM_HASHED = {  # variables vLLM 0.33's envs.compile_factors() hashes, with secret values
    "VLLM_BUILD_URL": "https://builduser:tok3nSECRETa1@build.example.internal/job/1",
    "VLLM_EC_SIDE_CHANNEL_HOST": "ec-secret-b2.internal",
    "MOONCAKE_REQUESTER_LOCAL_HOSTNAME": "mooncake-secret-c3.internal",
    "VLLM_P2P_SIDE_CHANNEL_HOST": "p2p-secret-d4.internal",
    "VLLM_RAY_DP_PLACEMENT_NODE_IPS": "10.77.66.55",
    "VLLM_BUILD_COMMIT": "commitsecrete5",
    "VLLM_IMAGE_TAG": "imagetagsecretf6",
    "VLLM_USAGE_SOURCE": "usagesecretg7",
    "VLLM_BUILD_PIPELINE": "pipelinesecreth8",
    "VLLM_LORA_RESOLVER_HF_REPO_LIST": "org/reposecreti9",
    "VLLM_GPU_NIC_PCIE_MAPPING": "nicsecretj10",
}
OTHER_SPELLINGS = {  # named like secrets (vLLM does not hash them; a later vLLM might)
    "FOO_APIKEY": "apikeysecretk11",
    "DB_PASS": "passsecretl12",
    "DB_PWD": "pwdsecretm13",
    "AZURE_STORAGE_SAS": "sv=2024&sig=sassecretn14",
    "SB_CONNECTION_STRING": "Endpoint=sb://x;SharedAccessKey=connsecreto15",
    "SENTRY_DSN": "https://dsnsecretp16@sentry.example/1",
    "SESSION_COOKIE": "cookiesecretq17",
    "X_TOKEN": "tokensecretr18",
    "my_password": "lowersecrets19",
    "hf_token": "hf_lowersecrett20",
    "VLLM_API_KEY": "apisecretu21",
    "AWS_SECRET_ACCESS_KEY": "awssecretv22",
    "PGPASSWORD": "pgsecretw23",
}
PLANTED = {**VLLM_HASHED, **OTHER_SPELLINGS}
URL_CREDENTIAL = "tok3nSECRETa1"


def _inflated(name: str, data: bytes) -> Iterator[tuple[str, bytes]]:
    """``data`` and everything inside it: tar members, a DSSE payload, gzip, nested once more."""
    yield name, data
    if data[:2] == b"\x1f\x8b":
        yield from _inflated(name + "|gunzip", gzip.decompress(data))
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar.getmembers():
                yield name + "|" + member.name, member.name.encode()
                extracted = tar.extractfile(member)
                if extracted is not None:
                    yield from _inflated(name + "|" + member.name, extracted.read())
    except tarfile.TarError:
        pass
    try:
        envelope = json.loads(data)
    except ValueError:
        return
    if isinstance(envelope, dict) and isinstance(envelope.get("payload"), str):
        yield from _inflated(name + "|payload", base64.b64decode(envelope["payload"]))


def shipped(store_dir: Path) -> list[tuple[str, bytes]]:
    """Every object under a ``file://`` store, inflated (at least one must be there)."""
    found = [
        blob
        for path in sorted(store_dir.rglob("*"))
        if path.is_file()
        for blob in _inflated(path.relative_to(store_dir).as_posix(), path.read_bytes())
    ]
    assert any(".tar|" in name for name, _ in found) and any(
        "|payload" in name for name, _ in found
    ), [n for n, _ in found]
    return found


def assert_nothing_planted(blobs: list[tuple[str, bytes]], planted: dict[str, str]) -> None:
    for name, data in blobs:
        text = data.decode("utf-8", "replace")
        leaked = [var for var, value in planted.items() if value in text or value.encode() in data]
        assert not leaked, f"{name} carries the value of {leaked}"
        assert URL_CREDENTIAL not in text and "cache_key_factors.json" not in name, name


def _signed_manifest(blobs: list[tuple[str, bytes]]) -> Manifest:
    return parse_manifest(next(data for name, data in blobs if name.endswith(".tar.sig|payload")))


def test_a_signed_and_pushed_cache_carries_no_planted_value(tmp_path: Path) -> None:
    """Without vLLM: vLLM's debug files in a ``<10 hex>`` directory, twenty spellings in its
    factors."""
    root = CacheRoot(tmp_path / "vllm-cache")
    inside = root.directory(SUBJECT) / "rank_0_0" / "backbone"
    inside.mkdir(parents=True)
    env = {
        **PLANTED,
        "VLLM_USE_AOT_COMPILE": False,
        "VLLM_PP_LAYER_PARTITION": "4,4",
        "VLLM_DISABLED_KERNELS": ["a"],
        "VLLM_TARGET_DEVICE": "https://user:tok@allowlisted-but-not-plain",
        "VLLM_PLUGINS": None,
    }
    raw = {"env": env, "config_hash": "ab" * 8, "code_hash": "c" * 64, "compiler_hash": "d" * 64}
    (inside / "cache_key_factors.json").write_text(json.dumps(raw))
    (inside / "computation_graph.py").write_text(f"# {VLLM_HASHED['VLLM_EC_SIDE_CHANNEL_HOST']}\n")
    (inside / "vllm_compile_cache.py").write_text("{}")
    signed = cc.sign_cache(root, SUBJECT, SIGNER, NOW)
    store = open_store(f"file://{tmp_path}/store")
    assert cc.push_cache(store, root, SUBJECT, KEYRING, NOW).action == "pushed"
    blobs = shipped(tmp_path / "store")
    assert_nothing_planted(blobs, {**PLANTED, "VLLM_TARGET_DEVICE": "allowlisted-but-not-plain"})
    assert signed.key_factors == _signed_manifest(blobs).key_factors
    factors = dict(signed.key_factors or {})
    members = {
        name.split("|")[1].rpartition("/")[2]
        for name, _ in blobs
        if name.split("|")[0].endswith(".tar") and "|" in name
    }
    assert members == {"rank_0_0", "backbone", "vllm_compile_cache.py"}  # no debug file archived
    # the allow-list in the clear; everything else keyed under the signed salt
    assert (
        factors["env"]["VLLM_USE_AOT_COMPILE"] is False
        and factors["env"]["VLLM_PP_LAYER_PARTITION"] == "4,4"
    )
    assert (
        factors["env"]["VLLM_DISABLED_KERNELS"] == ["a"] and factors["env"]["VLLM_PLUGINS"] is None
    )
    assert factors["code_hash"] == "c" * 64 and len(factors[SALT_KEY]) == 32
    assert all(factors["env"][name].startswith(KEYED) for name in [*PLANTED, "VLLM_TARGET_DEVICE"])
    # a node holding the same values compares equal; one that differs is told which, as two hashes
    mine = factors_of(json.dumps(raw).encode())
    assert mine is not None and differences(factors, mine) == []
    mine["env"]["VLLM_EC_SIDE_CHANNEL_HOST"] = "another-host"
    (row,) = differences(factors, mine)
    assert (
        row["input"] == "env.VLLM_EC_SIDE_CHANNEL_HOST"
        and row["signed"].startswith(KEYED)
        and row["here"].startswith(KEYED)
    )
    # the shared directory still verifies with vLLM's debug files beside the signed files
    assert verify_cache(root, SUBJECT, KEYRING, NOW).action == "verified"


def test_keyed_values_need_the_value_and_the_salt() -> None:
    """One salt per manifest: equal values compare under it, nothing precomputed matches across."""
    one, two = new_salt(), new_salt()
    assert one != two and keyed("host-a", one) == keyed("host-a", one) != keyed("host-a", two)
    # the credential never enters a hash
    assert keyed("https://u:p@h/x", one) == keyed("https://***@h/x", one)
    factors = keyed_factors(
        {"env": {"FOO_APIKEY": "k", "VLLM_USE_AOT_COMPILE": True}, "later_vllm": {"x": "y"}}, one
    )
    assert factors == {
        "env": {"FOO_APIKEY": keyed("k", one), "VLLM_USE_AOT_COMPILE": True},
        "later_vllm": {"x": keyed("y", one)},
        SALT_KEY: one,
    }
    assert "VLLM_USE_AOT_COMPILE" in CLEAR_ENV and "VLLM_BUILD_URL" not in CLEAR_ENV
    assert not {
        name for name in CLEAR_ENV if any(w in name for w in ("HOST", "PORT", "PATH", "URL", "_IP"))
    }
    with pytest.raises(ValueError):
        keyed_factors({}, "not-a-salt")


def test_older_factors_in_the_clear_still_verify_and_compare() -> None:
    """Manifests signed before keyed hashes (no salt) verify, and compare value by value."""
    old = {
        "env": {"VLLM_PLUGINS": "plancache", "HF_TOKEN": "sha256:" + "0" * 64},
        "config_hash": "abc",
    }
    sig = sign_manifest(
        Manifest(SUBJECT, (), ("rank_0_0",), "a" * 64, 512, NOW, None, "", old), SIGNER
    )
    manifest = verify_manifest(SUBJECT, sig, KEYRING, NOW).manifest
    assert manifest.key_factors == old and manifest.factors_salt is None
    rows = differences(
        old,
        {"env": {"VLLM_PLUGINS": "other", "HF_TOKEN": "sha256:" + "0" * 64}, "config_hash": "abc"},
    )
    assert rows == [{"input": "env.VLLM_PLUGINS", "signed": "plancache", "here": "other"}]
    payload = json.loads(base64.b64decode(json.loads(sig)["payload"]))
    payload["predicate"]["key_factors"][SALT_KEY] = "short"
    with pytest.raises(Exception, match="32 lowercase hex"):
        parse_manifest(json.dumps(payload).encode())


def test_this_nodes_comparable_form_masks_credentials() -> None:
    local = without_secrets(
        {"env": {"VLLM_BUILD_URL": VLLM_HASHED["VLLM_BUILD_URL"], "X": ["https://a:b@c"]}}
    )
    assert URL_CREDENTIAL not in json.dumps(local) and local["env"]["X"] == ["https://***@c"]


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig", "Authorization: Bearer ***"),
        ("authorization: basic dXNlcjpwYXNzd29yZA==", "authorization: basic ***"),
        ("Proxy-Authorization: Basic dXNlcjpw", "Proxy-Authorization: Basic ***"),
        ("x-amz-security-token: FQoGZXIvYXdzEJr", "x-amz-security-token: ***"),
        ("X-Amz-Security-Token=FQoGZXIvYXdzEJr", "X-Amz-Security-Token=***"),
        ("client_secret: s3cr3tv4lue", "client_secret: ***"),
        ("CLIENT_SECRET=s3cr3tv4lue", "CLIENT_SECRET=***"),
        (
            "https://login/token?client_secret=s3cr3tv4lue&x=1",
            "https://login/token?client_secret=***&x=1",
        ),
        (
            '{"client_secret": "s3cr3tv4lue", "Authorization": "Bearer abc"}',
            '{"client_secret": "***", "Authorization": "***"}',
        ),
        (
            "{'headers': {'x-amz-security-token': 'FQo'}}",
            "{'headers': {'x-amz-security-token': '***'}}",
        ),
        ("PIN-VALUE", "PIN-VALUE"),
        ("set PIN-VALUE and pin-source", "set PIN-VALUE and pin-source"),
        ("pkcs11:token=a?pin-value:1234", "pkcs11:token=a?pin-value=***"),
        ("trusted key: SHA256:abc at 12:30", "trusted key: SHA256:abc at 12:30"),
    ],
)
def test_credential_headers_are_masked_and_harmless_words_are_not(text: str, shown: str) -> None:
    assert safe_text(text, 500) == shown and redact(shown) == shown


@settings(max_examples=50, deadline=None)
@given(
    st.sampled_from(
        ["PIN-VALUE", "pin-source", "Authorization", "client_secret", "x-amz-security-token"]
    ),
    st.text(alphabet="-_ .,abcXYZ09", max_size=12),
)
@example("PIN-VALUE", "")
def test_a_credential_name_without_a_separator_and_value_is_shown_as_it_is(
    name: str, tail: str
) -> None:
    assert safe_text(name + tail, 1000) == name + tail  # no '=' or ':' after it: nothing to mask


# --- vLLM 0.33's real compile path, VLLM_USE_AOT_COMPILE=0 ----------------------------------------


@pytest.fixture(scope="module")
def cold_boots(
    tmp_path_factory: pytest.TempPathFactory, compile_zygote: Any
) -> Iterator[dict[str, Future[dict[str, Any]]]]:
    """The file's four cold boots (``<10 hex>`` with secrets planted, torch-named secrets in each
    layout, a clean AOT build), started together on the first test that needs one, two at a time
    (the machine has two cores): each needs nothing of the others (a directory, a key and a
    ``file://`` store of its own), and one after the other they took a minute and more with a
    core idle. Each test takes its own boot's result, as from a fixture of its own."""
    sys.path.insert(0, str(Path(__file__).parent))
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {
            "aot0-planted": pool.submit(_build_planted, tmp_path_factory),
            **{
                f"torch-{layout}": pool.submit(_build_torch_planted, tmp_path_factory, layout)
                for layout in sorted(LAYOUTS)
            },
            "clean-aot": pool.submit(_build_clean_aot, tmp_path_factory),
        }


@pytest.fixture(scope="module")
def built(cold_boots: dict[str, Future[dict[str, Any]]]) -> dict[str, Any]:
    """One cold boot that compiles, signs and pushes the ``<10 hex>`` layout with secrets
    planted."""
    return cold_boots["aot0-planted"].result()


def _build_planted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from compile_boots import AOT0, boot, cache_dir
    from compile_tampers import cli

    top = tmp_path_factory.mktemp("no-secret")
    (top / "keys").mkdir()
    key = str(top / "keys" / "key")
    assert cli("keygen", key).returncode == 0
    (top / "build").mkdir()
    report = boot(
        top / "build",
        PLANCACHE_SIGNING_KEY=key,
        PLANCACHE_URL=f"file://{top}/store",
        **AOT0,
        **PLANTED,
    )
    assert report["correct"], report["stderr"][-3000:]
    return {"top": top, "report": report, "dir": cache_dir(top / "build", aot=False)}


def test_vllms_real_compile_path_ships_no_planted_value(built: dict[str, Any]) -> None:
    """vLLM hashed the planted values into its cache key (the signed factors key exactly them: a
    node holding a value can compare it); none of them reaches the store, nor vLLM's debug file."""
    blobs = shipped(built["top"] / "store")
    assert_nothing_planted(blobs, PLANTED)
    factors = _signed_manifest(blobs).key_factors
    assert factors is not None and factors["env"]["VLLM_USE_AOT_COMPILE"] is False
    salt = factors[SALT_KEY]
    assert {name: factors["env"][name] for name in VLLM_HASHED} == {
        name: keyed(v, salt) for name, v in VLLM_HASHED.items()
    }
    # the shared directory is the signed archive's
    assert not list(built["dir"].rglob("cache_key_factors.json"))


# --- torch's environment snapshot: both vLLM compile layouts (issue 46) -------------------------

TORCH_PASSWORD = "r3disPASSw0rd"
TORCH_PLANTED = {  # named so torch's generate_env_vars_string copies each into what it compiles
    "TORCHINDUCTOR_REMOTE_CACHE_URL": f"redis://cacheuser:{TORCH_PASSWORD}@cache.example:6379/0",
    "MY_TRITON_API_TOKEN": "tritonTOKENsecret42",
    # what Kubernetes injects for a Service named triton-inference-server
    "TRITON_INFERENCE_SERVER_PORT": "tcp://10.43.211.7:8000",
    # the red team's (issue 46): names and shapes the first rules missed, all shipped then
    "TRITON_APITOKEN": "s3cr3t-triton-value",
    "TORCH_KEY_PASSPHRASE": "correct horse battery staple",
    "TORCHINDUCTOR_AUTH_HEADER": "Bearer abcdef0123456789",
    "TRITON_INFERENCE_SERVER_GRPC_PORT": "tcp://[fd00:10:96::a1b2]:8001",  # an IPv6 cluster
}
PROFILER = "VLLM_TORCH_PROFILER_DIR"  # planted under the boot's fake $HOME
NOT_PUSHED = re.compile(
    r'plancache: compile-cache not-pushed what=(\S+) cache=(\S+) reason=(\S+) detail="([^"]*)"'
)
LAYOUTS = {"aot0": False, "aot1": True}


def _grep_tree(directory: Path, values: list[str]) -> set[str]:
    """The planted values found in any file under ``directory`` (what vLLM and torch wrote)."""
    found = set()
    for path in directory.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found |= {v for v in values if v.encode() in data}
    return found


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def torch_planted(
    request: pytest.FixtureRequest, cold_boots: dict[str, Future[dict[str, Any]]]
) -> dict[str, Any]:
    """One cold boot per layout that compiles and signs with torch-named secrets planted, and
    pushes (or refuses to)."""
    return cold_boots[f"torch-{request.param}"].result()


def _build_torch_planted(tmp_path_factory: pytest.TempPathFactory, layout: str) -> dict[str, Any]:
    from compile_boots import AOT0, boot, cache_dir
    from compile_tampers import cli

    aot = LAYOUTS[layout]
    top = tmp_path_factory.mktemp(f"torch-planted-{layout}")
    (top / "keys").mkdir()
    key = str(top / "keys" / "key")
    assert cli("keygen", key).returncode == 0
    base = top / "build"
    base.mkdir()
    planted = {**TORCH_PLANTED, PROFILER: str(base / "home" / "profiles" / "run-1")}
    report = boot(
        base,
        PLANCACHE_SIGNING_KEY=key,
        PLANCACHE_URL=f"file://{top}/store",
        **({} if aot else AOT0),
        **planted,
    )
    assert report["correct"], report["stderr"][-3000:]
    return {"top": top, "report": report, "planted": planted, "dir": cache_dir(base, aot=aot)}


def test_torchs_environment_snapshot_is_never_pushed(torch_planted: dict[str, Any]) -> None:
    """torch copied every planted variable into the cache it compiled (the signed local cache
    holds them: the old code pushed exactly that); the push is refused as ``private-data`` with one
    line naming each variable, never its value, and the store holds no byte of any of them."""
    planted, stderr = torch_planted["planted"], torch_planted["report"]["stderr"]
    values = [*planted.values(), TORCH_PASSWORD]
    # what the node holds, signed: the values are there (the archive would have carried them)
    assert _grep_tree(torch_planted["dir"], values) >= {TORCH_PASSWORD, *TORCH_PLANTED.values()}
    refusals = NOT_PUSHED.findall(stderr)
    assert refusals, stderr[-3000:]
    (what, _, reason, detail), *_ = refusals
    assert (what, reason) == ("cache", "private-data")
    for name in planted:
        assert name in detail, detail
    # never a value, anywhere in the boot's output (vLLM's and torch's included)
    for value in [*values, "cacheuser", "10.43.211.7"]:
        assert value not in stderr, value
    store = torch_planted["top"] / "store"
    objects = [p for p in store.rglob("*") if p.is_file()] if store.exists() else []
    assert not [p.name for p in objects if p.name.endswith((".tar", ".tar.sig"))], objects
    assert_nothing_planted(
        [blob for p in objects for blob in _inflated(p.name, p.read_bytes())],
        {**planted, "password": TORCH_PASSWORD},
    )


def _build_clean_aot(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from compile_boots import boot
    from compile_tampers import cli

    top = tmp_path_factory.mktemp("clean-aot")
    (top / "keys").mkdir()
    key = str(top / "keys" / "key")
    assert cli("keygen", key).returncode == 0
    (top / "build").mkdir()
    report = boot(top / "build", PLANCACHE_SIGNING_KEY=key, PLANCACHE_URL=f"file://{top}/store")
    return {"top": top, "report": report}


def test_a_clean_aot_build_is_still_pushed(cold_boots: dict[str, Future[dict[str, Any]]]) -> None:
    """Every compiled file carries the cache root (the check lets it ship): a build node without
    private variables pushes its AOT cache and headers, and neither holds its (distinctive) home."""
    clean = cold_boots["clean-aot"].result()
    top, report = clean["top"], clean["report"]
    assert report["correct"], report["stderr"][-3000:]
    assert not NOT_PUSHED.findall(report["stderr"]), report["stderr"][-3000:]
    blobs = shipped(top / "store")
    assert any(name.endswith(".pch.gz|gunzip") for name, _ in blobs), [n for n, _ in blobs]
    home = str(top / "build" / "home").encode()
    root = str(top / "build" / "vllm-cache").encode()
    assert not [name for name, data in blobs if home in data]
    assert any(root in data for name, data in blobs if name.endswith(".so"))  # what ships by design
