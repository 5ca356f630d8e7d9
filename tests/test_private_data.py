"""Nothing private leaves the node (issue 46): what torch writes into a compile cache is searched
before a push, and signed plan statements carry no credential.

torch's ``generate_env_vars_string`` copies every variable named with TORCH, DYNAMO, INDUCTOR or
TRITON into what it compiles, as ``os.environ['NAME'] = 'value'``. These tests plant such
snapshots (and this node's home, user and host names) in a cache's files, as torch writes them,
and push through the CLI and the flows to a ``file://`` store: the push is refused as
``private-data`` (the variable and file named, never the value) and the store stays empty; a
cache that only carries its own cache root (as every compiled ``.so`` does) is pushed. vLLM's real
compile path, both layouts, is tests/test_no_secret_shipped.py's.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from cli_support import keys, run  # noqa: F401 - keys is a fixture
from conftest import FP, NOW, keyring_of, make_signer, plan_bytes
from plancache.pipeline.compile_cache import flows, shipping_check
from plancache.pipeline.compile_cache.header_shipping import push_headers
from plancache.pipeline.compile_cache.local_caches import CacheRoot
from plancache.storage.store import open_store
from plancache.trust.compile_cache.private_data import (
    node_secrets,
    private_kind,
    refusal,
    scan,
)
from plancache.trust.errors import Reason, Rejected
from plancache.trust.plans.plan import plan_name
from plancache.trust.signing import sign_or_cosign, sign_plan
from plancache.trust.statement import parse_statement
from plancache.trust.verify import verify_plan

SIGNER = make_signer()
KEYRING = keyring_of(SIGNER)
SUBJECT = "torch_aot_compile/" + "ab" * 32
PASSWORD = "r3disPASSw0rd"
PLANTED = {
    "TORCHINDUCTOR_REMOTE_CACHE_URL": f"redis://cacheuser:{PASSWORD}@cache.example:6379/0",
    "MY_TRITON_API_TOKEN": "tritonTOKENsecret42",
    "TRITON_INFERENCE_SERVER_PORT": "tcp://10.43.211.7:8000",
}


def snapshot(env: dict[str, str]) -> bytes:
    """torch 2.13's ``generate_env_vars_string`` as it lands in a pickled ``runnable_graph_str``."""
    lines = [f"""os.environ['{k}'] = '{v.replace("'", '"')}'""" for k, v in env.items()]
    lines.append("os.environ.pop('TORCHDYNAMO_REPRO_AFTER', None)")
    return b"\x80\x05\x95X\x8c\x0bruntime\x94" + ("import os\n" + "\n".join(lines)).encode()


def cache(tmp_path: Path, model: bytes, so: bytes = b"\x7fELF", sign: bool = True) -> CacheRoot:
    """A signed AOT cache whose ``rank_0_0/model`` and a compiled ``.so`` hold what is given."""
    root = CacheRoot(tmp_path / "vllm-cache")
    directory = root.directory(SUBJECT)
    (directory / "rank_0_0").mkdir(parents=True)
    (directory / "inductor_cache" / "ab").mkdir(parents=True)
    (directory / "rank_0_0" / "model").write_bytes(model)
    (directory / "inductor_cache" / "ab" / "cab.so").write_bytes(
        so + f"\0{root.root}/plancache-private/boot-x/inductor_cache/ab/cab.cpp\0".encode()
    )
    assert not sign or flows.sign_cache(root, SUBJECT, SIGNER, NOW).action == "signed"
    return root


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process as a build node: a distinctive home, the planted variables set."""
    home = tmp_path / "home" / "alice"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    for name, value in PLANTED.items():
        monkeypatch.setenv(name, value)
    return home


def stored(tmp_path: Path) -> list[Path]:
    return [p for p in (tmp_path / "store").rglob("*") if p.is_file()]


def test_a_cache_with_torchs_snapshot_is_not_pushed_and_the_line_names_each_variable(
    tmp_path: Path, node: Path, keys: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profiler = str(node / "profiles")
    root = cache(tmp_path, snapshot({**PLANTED, "VLLM_TORCH_PROFILER_DIR": profiler}), sign=False)
    code, _, _ = run(capsys, "compile-cache", "sign", "--key", str(keys), str(root.root))
    assert code == 0  # signing is local: the node's own cache still loads here
    code, out, err = run(
        capsys,
        "compile-cache",
        "push",
        "--json",
        "--trusted-keys",
        f"{keys}.pub",
        str(root.root),
        f"file://{tmp_path}/store",
    )
    (row,) = json.loads(out)["caches"]
    assert code == 1 and (row["action"], row["reason"]) == ("rejected", "private-data"), out
    (line,) = err.splitlines()
    assert "private-data" in line and "rank_0_0/model" in line
    for name in [*PLANTED, "VLLM_TORCH_PROFILER_DIR"]:
        assert name in row["detail"] and name in line
    for value in [*PLANTED.values(), PASSWORD, "10.43.211.7", profiler, "cacheuser"]:
        assert value not in out and value not in err
    assert stored(tmp_path) == []  # neither the archive nor its signature


def test_torchs_snapshot_is_judged_on_its_own_where_the_environment_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``push`` run by another job (no planted variable in its environment) still refuses."""
    root = cache(tmp_path, snapshot(PLANTED))
    for name in PLANTED:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(Rejected) as caught:
        flows.push_cache(open_store(f"file://{tmp_path}/store"), root, SUBJECT, KEYRING, NOW)
    assert caught.value.reason is Reason.PRIVATE_DATA
    assert all(name in caught.value.detail for name in PLANTED)
    assert stored(tmp_path) == []


def test_an_environment_value_is_found_anywhere_and_gzip_is_inflated(
    tmp_path: Path, node: Path
) -> None:
    """A private value of this node's environment outside any snapshot (in a gzip member too)."""
    root = cache(tmp_path, gzip.compress(b"\x80\x05" + b"x" * 100 + PASSWORD.encode()))
    with pytest.raises(Rejected, match=r"TORCHINDUCTOR_REMOTE_CACHE_URL.*rank_0_0/model"):
        flows.push_cache(open_store(f"file://{tmp_path}/store"), root, SUBJECT, KEYRING, NOW)


def test_every_gzip_member_of_a_file_is_inflated(tmp_path: Path, node: Path) -> None:
    """A file of two gzip members (what ``gzip.open`` reads whole): the second was not searched."""
    root = cache(tmp_path, gzip.compress(b"\x80\x05clean") + gzip.compress(PASSWORD.encode()))
    with pytest.raises(Rejected, match=r"TORCHINDUCTOR_REMOTE_CACHE_URL.*rank_0_0/model"):
        flows.push_cache(open_store(f"file://{tmp_path}/store"), root, SUBJECT, KEYRING, NOW)
    assert stored(tmp_path) == []


def test_a_neutral_cache_root_ships_and_a_clean_cache_is_pushed(tmp_path: Path, node: Path) -> None:
    """Every compiled file carries the root it was built under: a neutral root (no home, user or
    host name in it) ships by design; a snapshot of harmless settings too."""
    root = CacheRoot(tmp_path / "var" / "cache" / "vllm")
    harmless = {
        "TORCHINDUCTOR_CACHE_DIR": f"{root.root}/plancache-private/boot-1/inductor",
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "TORCH_CUDA_ARCH_LIST": "8.0 9.0",
        "TRITON_CACHE_DIR": f"{root.root}/plancache-private/boot-1/triton",
    }
    directory = root.directory(SUBJECT)
    (directory / "rank_0_0").mkdir(parents=True)
    (directory / "rank_0_0" / "model").write_bytes(snapshot(harmless) + str(root.root).encode())
    flows.sign_cache(root, SUBJECT, SIGNER, NOW)
    store = open_store(f"file://{tmp_path}/store")
    assert flows.push_cache(store, root, SUBJECT, KEYRING, NOW).action == "pushed"
    # ... but the home is not
    (directory / "rank_0_0" / "model").write_bytes(snapshot(harmless) + f"{node}/x".encode())
    (directory.parent / (directory.name + ".plancache.sig")).unlink()
    flows.sign_cache(root, SUBJECT, SIGNER, NOW)
    with pytest.raises(Rejected, match=r"\$HOME"):
        flows.push_cache(store, root, SUBJECT, KEYRING, NOW)


def test_a_cache_root_under_the_home_is_not_shipped(tmp_path: Path, node: Path) -> None:
    """vLLM's default root, ``~/.cache/vllm``, under a distinctive home: every compiled file
    carries it, user name and all (issue 46), so the push is refused naming the home, with the
    neutral root as the fix."""
    root = CacheRoot(node / ".cache" / "vllm")
    directory = root.directory(SUBJECT)
    (directory / "rank_0_0").mkdir(parents=True)
    (directory / "rank_0_0" / "model").write_bytes(b"compiled under " + str(root.root).encode())
    flows.sign_cache(root, SUBJECT, SIGNER, NOW)
    store = open_store(f"file://{tmp_path}/store")
    with pytest.raises(Rejected, match=r"\$HOME.*neutral root"):
        flows.push_cache(store, root, SUBJECT, KEYRING, NOW)
    assert stored(tmp_path) == []


def test_headers_with_a_private_path_are_neither_signed_nor_pushed(
    tmp_path: Path, node: Path
) -> None:
    base = tmp_path / "private"
    headers = base / "headers"
    headers.mkdir(parents=True, mode=0o700)
    base.chmod(0o700)
    (headers / ("a" * 52 + ".h.gch")).write_bytes(
        b"gpch" + f"{base}/headers\0{node}/inc\0".encode()
    )
    store = open_store(f"file://{tmp_path}/store")
    with pytest.raises(Rejected, match=r"\$HOME .* in a{52}\.h\.gch"):
        push_headers(
            store,
            SUBJECT,
            base,
            headers,
            ["a" * 52 + ".h.gch"],
            SIGNER,
            NOW,
            cache_archive_sha256="0" * 64,
        )
    assert stored(tmp_path) == []


@pytest.mark.parametrize(
    ("name", "value", "kind"),
    [
        ("TORCHINDUCTOR_REMOTE_CACHE_URL", "redis://u:p@h:1", "a URL with credentials"),
        ("MY_TRITON_API_TOKEN", "abc", "a secret-named variable"),
        ("TRITON_INFERENCE_SERVER_PORT", "tcp://10.0.0.1:8000", "an internal address"),
        ("TRITON_SERVICE_HOST", "100.64.3.4", "an internal address"),
        ("TORCH_X", "triton.ns.svc.cluster.local:80", "an internal address"),
        ("TORCH_Y", "hf_abcdefghijklmnop", "a token"),
        ("TORCH_Z", "AbCdEf0123456789GhIjKl", "a token"),
        ("TORCHINDUCTOR_COMPILE_THREADS", "8", ""),
        ("TORCH_SOME_TOKEN", "1", ""),
        ("TORCHINDUCTOR_MAX_TOKENS", "4096", ""),
        ("PWD", "/work/app", ""),
        ("TORCH_HOST", "127.0.0.1", ""),
        ("TORCH_DIR", "/root/.cache/x", ""),
        ("TORCH_HASH", "0" * 64, ""),
        # the red team's (issue 46): the word anywhere in the name, credentials in the value
        ("TRITON_APITOKEN", "s3cr3t-triton-value", "a secret-named variable"),
        ("TORCHINDUCTOR_REDIS_AUTHTOKEN", "abcdefghij0123", "a secret-named variable"),
        ("TORCH_KEY_PASSPHRASE", "correct horse battery staple", "a secret-named variable"),
        ("TRITON_AUTH_HEADER", "x", "a secret-named variable"),
        ("TORCH_X", "Bearer abcdef0123456789", "a token"),
        ("TORCH_X", "http://triton.ml:8000/v2?token=abc123xyz", "a credential"),
        ("TORCH_X", "tcp://[fd00:10:96::a1b2]:8000", "an internal address"),
        ("TORCH_X", "fe80::1%eth0", "an internal address"),
        ("TORCH_X", "/home/bob/profiles/run-1", "a path under a user's home"),
        ("TORCH_X", "/Users/bob", "a path under a user's home"),
        ("TORCHINDUCTOR_MAX_TOKENS", "32768", ""),
        ("TOKENIZERS_PARALLELISM", "false", ""),
        ("TORCH_AUTHOR_NAME", "someone", ""),
        ("TORCH_X", "tcp://[2606:4700::1111]:80", ""),
        ("TORCH_X", "[::1]:8000", ""),
        ("TORCH_X", "std::vector<int>", ""),
        ("TORCH_X", "/opt/home/x", ""),
    ],
)
def test_what_looks_private(name: str, value: str, kind: str) -> None:
    assert private_kind(name, value, home="/root", user="root", host="vm") == kind


def test_names_of_the_node_only_where_distinctive() -> None:
    plain = node_secrets({}, home="/root", user="root", host="vm")
    assert scan("f", b"/root/x /home/root vm localhost", plain) == []
    mine = node_secrets({}, home="/home/alice", user="alice", host="build-node-7")
    found = {f.what for f in scan("f", b"/home/alice/x torchinductor_alice build-node-7.", mine)}
    assert found == {"$HOME", "user name", "host name"}
    assert scan("f", b"/home/alicex build-node-77 /tmp/torchinductor_alice2", mine) == []
    # the line says what to do about a name, not "unset it" (red team)
    line = refusal(scan("f", b"build-node-7.", mine))
    assert "host name" in line and "neutral root and host name" in line and "unset it" not in line
    token = node_secrets({"X_TOKEN": "t0k3n-value"})
    assert "(unset it on the build node" in refusal(scan("f", b"=t0k3n-value", token))


GCC_IDENTS = (
    b"\0GCC: (Debian 12.2.0-14+deb12u1) 12.2.0\0GCC: (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0\0"
)
"""What gcc writes into each object's ``.comment`` on Debian and Ubuntu (``readelf -p``)."""


@pytest.mark.parametrize("host", ["debian", "ubuntu"])
def test_a_distributions_default_host_name_does_not_refuse_its_compilers_objects(
    host: str,
) -> None:
    """Debian's and Ubuntu's installers name the host after the distribution, and their gcc
    writes that name into every ``.so``: searched for, no clean cache built there would push."""
    secrets = node_secrets({}, home="/root", user="root", host=host)
    assert scan("cab.so", b"\x7fELF" + GCC_IDENTS, secrets) == []
    assert private_kind("TORCH_X", f"http://{host}:80", host=host) == ""


def test_an_allowed_path_is_masked_whole_and_never_hides_the_home() -> None:
    """The cache root is masked only as a whole path (not the start of a longer name that holds
    a secret), and an allowed path that is the home or above it (``PLANCACHE_PRIVATE_DIR=$HOME``)
    masks nothing of it."""
    token = "/var/cache/vllm-alice-token"
    secrets = node_secrets(
        {"X_TOKEN": token}, home="/root", user="root", host="vm", allowed=["/var/cache/vllm"]
    )
    assert [f.what for f in scan("f", b"/var/cache/vllm/a.so " + token.encode(), secrets)] == [
        "X_TOKEN"
    ]
    assert scan("f", b"\0/var/cache/vllm/a.so\0/var/cache/vllm\0", secrets) == []
    for allowed in (["/home/alice"], ["/home/alice/"], ["/home"], ["/h"]):
        mine = node_secrets({}, home="/home/alice", user="alice", host="vm", allowed=allowed)
        found = {f.what for f in scan("f", b"/home/alice/venv/include/x.h", mine)}
        assert found == {"$HOME", "user name"}, allowed
    root = node_secrets({}, home="/home/alice", user="alice", allowed=["/home/alice/.cache/vllm"])
    found = {f.what for f in scan("f", b"/home/alice/.cache/vllm/x.so", root)}
    assert found == {"$HOME", "user name"}  # a root that names the home is not masked


def test_a_snapshot_value_across_lines_is_judged() -> None:
    """torch writes a value as it is, newlines included (the entry spans lines)."""
    found = scan("m", snapshot({"TRITON_X_TOKEN": "abc\ndefgh123"}), node_secrets({}))
    assert [f.what for f in found] == ["TRITON_X_TOKEN"]


def test_a_snapshot_value_longer_than_the_cap_is_judged_by_its_start() -> None:
    """A value past MAX_VALUE (a long JSON setting) was skipped whole: judged by its start."""
    value = "redis://u:p4ss@cache.example/0 " + "x" * 5000
    found = scan("m", snapshot({"TORCHINDUCTOR_X": value}), node_secrets({}))
    assert [(f.what, f.kind) for f in found] == [("TORCHINDUCTOR_X", "a URL with credentials")]


def test_a_models_credentials_are_not_signed_into_provenance() -> None:
    """A model given as a URL with credentials signs as output shows it; co-signing with the same
    request compares the redacted form (kept, not a statement mismatch)."""
    model = "https://user:hfSECRETtok@hub.example/org/model?token=qsSECRET&rev=main"
    name = plan_name(FP)
    sig = sign_plan(name, plan_bytes(), SIGNER, NOW, provenance={"model": model})
    statement = verify_plan(name, plan_bytes(), sig, KEYRING, NOW).statement
    assert statement is not None
    assert statement.provenance["model"] == "https://***@hub.example/org/model?token=***&rev=main"
    assert (
        b"SECRET" not in sig
        and b"SECRET"
        not in json.dumps(parse_statement(statement.to_json_bytes()).provenance).encode()
    )
    action, _ = sign_or_cosign(
        name, plan_bytes(), sig, SIGNER, NOW, keyring=KEYRING, provenance={"model": model}
    )
    assert action == "kept"


def test_a_models_home_path_signs_without_the_user_name() -> None:
    """A model given as a path under a home (the plugin signs ``model_config.model`` as given)
    signed the build node's user name into a statement every store reader sees (red team)."""
    name = plan_name(FP)
    for model, shown in [
        ("/home/alice/models/llama-3", "/home/***/models/llama-3"),
        ("/Users/bob/m", "/Users/***/m"),
        ("org/llama-3-home", "org/llama-3-home"),
    ]:
        sig = sign_plan(name, plan_bytes(), SIGNER, NOW, provenance={"model": model})
        statement = verify_plan(name, plan_bytes(), sig, KEYRING, NOW).statement
        assert statement is not None and statement.provenance["model"] == shown
    action, _ = sign_or_cosign(
        name,
        plan_bytes(),
        sign_plan(name, plan_bytes(), SIGNER, NOW, provenance={"model": "/home/alice/m"}),
        SIGNER,
        NOW,
        keyring=KEYRING,
        provenance={"model": "/home/alice/m"},
    )
    assert action == "kept"


def test_check_archive_reads_every_member(tmp_path: Path) -> None:
    secrets = shipping_check.this_node([tmp_path])
    from plancache.storage.compile_cache.archive_format import archive_bytes
    from plancache.trust.compile_cache.manifest import FileEntry

    (tmp_path / "a").write_bytes(b"x" * 10000)
    inside = snapshot({"TORCH_T": "tcp://192.168.1.2:1"})
    (tmp_path / "b").write_bytes(inside)
    files = (FileEntry("a", 10000, ""), FileEntry("b", len(inside), ""))
    data = archive_bytes(tmp_path, files, ())
    with pytest.raises(Rejected, match=r"TORCH_T \(an internal address\) in b"):
        shipping_check.check_archive(data, secrets)
