"""``plancache compile-cache`` as an operator runs it (issue 17 item 8).

One real cold boot of vLLM 0.33's compile path (the recipe's toy module, AOT layout) with the
plugin signing what vLLM saved: ``verify`` and ``push`` of that root exit 0, and the unsigned
``<10 hex>`` directory vLLM leaves beside the AOT cache is reported as its debug dump, not as a
rejected cache. The rest runs on synthetic roots shaped like it (fast): a debug dump that holds
anything else (the file that makes vLLM load artifacts, a link) is an ordinary unsigned cache
again; the store URL comes from ``URL``, ``--url`` or ``$PLANCACHE_URL`` in ``plancache
push [DIR] URL`` / ``pull URL [DIR]`` order; a ROOT that does not exist is exit 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plancache.cli.main import main

sys.path.insert(0, str(Path(__file__).parent))
from compile_tampers import PY, SRC, cli

AOT = "torch_aot_compile/" + "cd" * 32
DUMP = "0123456789"
DEBUG_FILES = ("rank_0_0/backbone/computation_graph.py", "rank_0_0/backbone/cache_key_factors.json")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if "--json" in argv else out), err


def rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["cache"]: row for row in doc["caches"]}


@pytest.fixture(scope="module")
def plugin_signed(tmp_path_factory: pytest.TempPathFactory, compile_zygote: Any) -> dict[str, Path]:
    """A root signed by the plugin itself during one real cold boot (AOT layout), forked from the
    session's compile zygote (tests/conftest.py) when there is one; that fixture skips without
    vLLM, looking it up without importing it into this process (an import costs ~10 s here)."""
    top = tmp_path_factory.mktemp("plugin-signed")
    for name in ("home", "tmp", "keys"):
        (top / name).mkdir()
    assert cli("keygen", str(top / "keys" / "key")).returncode == 0
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PLANCACHE_", "VLLM_", "TORCHINDUCTOR_", "TRITON_"))
    }
    env.update(
        PYTHONPATH=SRC,
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        VLLM_CACHE_ROOT=str(top / "root"),
        HOME=str(top / "home"),
        TMPDIR=str(top / "tmp"),
        PLANCACHE_COMPILE_CACHE="1",
        PLANCACHE_TRUSTED_KEYS=str(top / "keys" / "key.pub"),
        PLANCACHE_SIGNING_KEY=str(top / "keys" / "key"),
    )
    if compile_zygote is not None:
        done = compile_zygote.run([], env, os.getcwd(), timeout=900)
    else:
        done = subprocess.run(
            [PY, str(Path(__file__).parent / "compile_toy.py")],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    assert '"num_aot_artifacts_saved": 1' in done.stdout, done.stderr[-3000:]
    return {"root": top / "root", "keys": top / "keys" / "key.pub", "top": top}


def test_a_root_the_plugin_signed_verifies_and_pushes_with_its_debug_dump_shown_as_such(
    plugin_signed: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root, keys = str(plugin_signed["root"]), str(plugin_signed["keys"])
    caches = sorted(
        p.relative_to(plugin_signed["root"] / "torch_compile_cache").as_posix()
        for p in (plugin_signed["root"] / "torch_compile_cache").glob("*")
        if p.is_dir()
    )
    dumps = [c for c in caches if c != "torch_aot_compile"]
    assert len(dumps) == 1 and len(dumps[0]) == 10  # vLLM's VllmBackend directory, unsigned
    code, doc, _ = run(capsys, "compile-cache", "verify", "--json", "--trusted-keys", keys, root)
    found = rows(doc)
    assert code == 0 and doc["ok"] is True, doc
    assert found[dumps[0]]["action"] == "debug" and found[dumps[0]]["ok"] is True
    (aot,) = [c for c in found if c.startswith("torch_aot_compile/")]
    assert found[aot]["action"] == "verified"
    store = plugin_signed["top"] / "store"
    code, doc, _ = run(
        capsys, "compile-cache", "push", "--json", "--trusted-keys", keys, root, f"file://{store}"
    )
    assert (
        code == 0
        and rows(doc)[aot]["action"] == "pushed"
        and rows(doc)[dumps[0]]["action"] == "debug"
    ), doc
    pushed = sorted(p.relative_to(store).as_posix() for p in store.rglob("*") if p.is_file())
    assert pushed == [f"torch_compile_cache/{aot}.tar", f"torch_compile_cache/{aot}.tar.sig"]
    code, doc, _ = run(capsys, "compile-cache", "ls", "--json", root)
    assert (
        code == 0
        and rows(doc)[dumps[0]]["action"] == "debug"
        and rows(doc)[aot]["action"] == "unverified"
    )


@pytest.fixture
def synthetic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Path]:
    """An AOT cache signed alone (as the plugin signs it) beside a debug dump shaped as vLLM's."""
    root = tmp_path / "vllm"
    aot = root / "torch_compile_cache" / AOT
    (aot / "rank_0_0").mkdir(parents=True)
    (aot / "rank_0_0" / "model").write_bytes(b"\x80\x04model" * 50)
    for rel in DEBUG_FILES:
        path = root / "torch_compile_cache" / DUMP / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# for humans\n")
    assert main(["keygen", str(tmp_path / "k")]) == 0
    assert (
        main(["compile-cache", "sign", "--key", str(tmp_path / "k"), "--cache", AOT, str(root)])
        == 0
    )
    capsys.readouterr()
    return {
        "root": root,
        "keys": tmp_path / "k.pub",
        "dump": root / "torch_compile_cache" / DUMP,
        "tmp": tmp_path,
    }


@pytest.mark.parametrize(
    "plant",
    ["vllm_compile_cache.py", "artifact_shape_None_subgraph_0", "top-level", "symlink", "sidecar"],
)
def test_a_debug_dump_with_anything_else_is_an_ordinary_cache_again(
    synthetic: dict[str, Path], capsys: pytest.CaptureFixture[str], plant: str
) -> None:
    dump = synthetic["dump"]
    if plant == "top-level":
        (dump / "computation_graph.py").write_text("x = 1\n")  # not under rank_<r>_<dp>/
    elif plant == "symlink":
        (dump / "rank_0_0" / "backbone" / "computation_graph.py").unlink()
        (dump / "rank_0_0" / "backbone" / "computation_graph.py").symlink_to("/etc/hostname")
    elif plant == "sidecar":
        (dump.parent / f"{DUMP}.plancache.sig").write_bytes(b"{}")
    else:
        (dump / "rank_0_0" / "backbone" / plant).write_text("{}\n")
    code, doc, _ = run(
        capsys,
        "compile-cache",
        "verify",
        "--json",
        "--trusted-keys",
        str(synthetic["keys"]),
        str(synthetic["root"]),
    )
    assert code == 1 and rows(doc)[DUMP]["action"] == "rejected", doc
    assert rows(doc)[AOT]["action"] == "verified"


def test_push_and_pull_take_the_url_as_argument_flag_or_environment(
    synthetic: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, keys, tmp = str(synthetic["root"]), str(synthetic["keys"]), synthetic["tmp"]
    monkeypatch.delenv("PLANCACHE_URL", raising=False)
    trust = ["--trusted-keys", keys]
    code, doc, err = run(capsys, "compile-cache", "push", "--json", *trust, root)
    assert (
        code == 2
        and doc["error"]["reason"] == "config-error"
        and "PLANCACHE_URL" in doc["error"]["detail"]
    )
    assert "NameError" not in err and len(err.strip().splitlines()) == 1
    monkeypatch.setenv("PLANCACHE_URL", f"file://{tmp}/env-store")
    # [ROOT], URL from the environment
    assert run(capsys, "compile-cache", "push", "--json", *trust, root)[0] == 0
    assert (tmp / "env-store" / "torch_compile_cache" / f"{AOT}.tar.sig").is_file()
    assert (
        run(capsys, "compile-cache", "push", "--json", *trust, root, f"file://{tmp}/arg-store")[0]
        == 0
    )
    assert (tmp / "arg-store" / "torch_compile_cache" / f"{AOT}.tar.sig").is_file()
    assert (
        run(
            capsys,
            "compile-cache",
            "push",
            "--json",
            *trust,
            "--url",
            f"file://{tmp}/flag-store",
            root,
        )[0]
        == 0
    )
    assert (tmp / "flag-store" / "torch_compile_cache" / f"{AOT}.tar.sig").is_file()
    code, doc, _ = run(
        capsys, "compile-cache", "push", "--json", *trust, "--url", "file:///a", root, "file:///b"
    )
    assert code == 2 and "two different store URLs" in doc["error"]["detail"]
    code, doc, _ = run(
        capsys, "compile-cache", "push", "--json", *trust, root, str(tmp / "not-a-url")
    )
    assert code == 2 and "is not a store URL" in doc["error"]["detail"]

    monkeypatch.chdir(tmp)
    for argv, dest in (
        (["pull", "--json", *trust, f"file://{tmp}/arg-store", str(tmp / "a")], "a"),  # URL ROOT
        (["pull", "--json", *trust, str(tmp / "b")], "b"),  # ROOT, URL from the environment
        (["pull", "--json", *trust, "--url", f"file://{tmp}/flag-store", str(tmp / "c")], "c"),
    ):
        code, doc, _ = run(capsys, "compile-cache", *argv)
        assert code == 0 and rows(doc)[AOT]["action"] == "pulled", (argv, doc)
        assert run(capsys, "compile-cache", "verify", "--json", *trust, str(tmp / dest))[0] == 0
    # URL alone: the default root, created by pull
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp / "d"))
    code, doc, _ = run(capsys, "compile-cache", "pull", "--json", *trust, f"file://{tmp}/arg-store")
    assert code == 0 and rows(doc)[AOT]["action"] == "pulled", doc


@pytest.mark.parametrize("action", ["sign", "verify", "ls", "push"])
def test_a_root_that_does_not_exist_is_exit_2(
    synthetic: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    action: str,
) -> None:
    extra = {
        "sign": ["--key", str(synthetic["tmp"] / "k")],
        "push": ["--trusted-keys", str(synthetic["keys"])],
        "verify": ["--trusted-keys", str(synthetic["keys"])],
        "ls": [],
    }[action]
    missing = synthetic["tmp"] / "no-such-root"
    tail = [f"file://{synthetic['tmp']}/store"] if action == "push" else []
    code, doc, err = run(capsys, "compile-cache", action, "--json", *extra, str(missing), *tail)
    assert code == 2 and doc["ok"] is False and doc["error"]["reason"] == "config-error", doc
    assert "does not exist" in doc["error"]["detail"] and len(err.strip().splitlines()) == 1
    code, out, err = run(capsys, "compile-cache", action, *extra, str(missing), *tail)
    assert code == 2 and out == "" and err.count("\n") == 1 and "does not exist" in err
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(missing))  # the default root, missing, as well
    assert run(capsys, "compile-cache", action, "--json", *extra, *tail)[0] == 2
    (synthetic["tmp"] / "a-file").write_text("")
    code, doc, _ = run(
        capsys, "compile-cache", action, "--json", *extra, str(synthetic["tmp"] / "a-file"), *tail
    )
    assert code == 2 and "is not a directory" in doc["error"]["detail"]
