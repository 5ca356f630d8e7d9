"""Who signed, in every report, for every signed kind (issue 37 item 5): a plan set's and a compile
cache's ``signed_by`` and ``keyless`` in ``verify``/``ls --json`` (and compile-cache ``pull``),
naming a keyless signer by its identity, issuer and log index even when its trusted-keys line
gives it a ``name=``; a key-signed set or cache keeps its fields, plus ``signed_by`` with name
and key id. Through the local Fulcio/Rekor (tests/sigstore_stack.py) and ``file://`` stores."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from cli_support import run
from conftest import GIB
from plancache.keys.keyfile import generate_keypair
from plancache.keys.schemes import load_signer
from plancache.pipeline.resolver import utcnow
from plancache.trust.keyring.keys import Signer
from plancache.trust.plans.plan import Plan, plan_name, render_plan
from plancache.trust.plans.plan_set_names import set_name
from plancache.trust.signing import sign_plan
from sigstore_stack import SigstoreStack

IDENTITY = "https://github.com/acme/serving/.github/workflows/bake.yml@refs/heads/main"
WORLD = [f"{0x5161_0000 + r:016x}" for r in range(2)]
AOT = "torch_aot_compile/" + "ef" * 32
SCHEMA = json.loads(resources.files("plancache.cli").joinpath("report.schema.json").read_text())
SET_FIELDS = {"name", "set", "replica", "status", "reason", "detail", "fingerprints", "signers"}
SET_FIELDS |= {"signed_at"}
CACHE_FIELDS = {"cache", "action", "ok", "reason", "detail", "files", "bytes", "signers"}
"""A report's fields before this change: kept, with ``signed_by`` and ``keyless`` added."""


@pytest.fixture(scope="module")
def stack() -> Iterator[SigstoreStack]:
    with SigstoreStack() as s:
        yield s


@pytest.fixture
def files(stack: SigstoreStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """The trust configuration, root, a token, and trusted keys whose one line names the
    identity ``bake``: a name that must not hide the identity in any report."""
    paths = stack.client_files(
        tmp_path, IDENTITY, f"name=bake sigstore issuer={stack.issuer} identity={IDENTITY}"
    )
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUST_CONFIG", str(paths["config"]))
    monkeypatch.setenv("SIGSTORE_ID_TOKEN", paths["token"].read_text())
    monkeypatch.delenv("PLANCACHE_SIGSTORE_TRUSTED_ROOT", raising=False)
    # the CLI sets these from its flags for the rest of the process: restored after each test
    monkeypatch.setenv("PLANCACHE_SIGSTORE_IDENTITY_TOKEN_FILE", "")
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUSTED_ROOT", "")
    return paths


def json_run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code, out, err = run(capsys, *argv, "--json")
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    return code, doc | {"_err": err}


def assert_keyless(who: list[dict[str, Any]], stack: SigstoreStack) -> None:
    """One signer, named ``bake`` by its line, and shown by what the bundle proved."""
    (one,) = who
    assert one["name"] == "bake" and one["keyid"].startswith("sigstore:"), one
    assert (one["identity"], one["issuer"]) == (IDENTITY, stack.issuer)
    assert isinstance(one["log_index"], int) and one["log_index"] >= 0


def baked(directory: Path, signer: Signer) -> Path:
    """A two-rank world, each plan signed by ``signer`` with its rank (what push groups)."""
    directory.mkdir()
    for rank, fp in enumerate(WORLD):
        data = render_plan(Plan(fp, 20 * GIB, 70 * GIB))
        sig = sign_plan(
            plan_name(fp),
            data,
            signer,
            utcnow() - timedelta(minutes=1),
            provenance={"rank": rank, "world_size": len(WORLD)},
        )
        (directory / plan_name(fp)).write_bytes(data)
        (directory / f"{plan_name(fp)}.sig").write_bytes(sig)
    return directory


def synthetic_cache(root: Path) -> Path:
    aot = root / "torch_compile_cache" / AOT
    (aot / "rank_0_0").mkdir(parents=True)
    (aot / "rank_0_0" / "model").write_bytes(b"\x80\x04model" * 50)
    return root


# -- plan sets ----------------------------------------------------------------------------------


def test_a_keylessly_pushed_plan_set_names_its_identity_in_ls_and_verify(
    capsys: pytest.CaptureFixture[str], stack: SigstoreStack, files: dict[str, Path], tmp_path: Path
) -> None:
    directory = baked(tmp_path / "bake", load_signer("sigstore"))
    url = f"file://{tmp_path / 'store'}"
    code, doc = json_run(capsys, "push", str(directory), url, "--key", "sigstore")
    assert code == 0 and [s["name"] for s in doc["plan_sets"]] == [set_name(WORLD)], doc
    trust = ("--trusted-keys", str(files["trusted"]), "--trusted-root", str(files["root"]))
    for command in ("ls", "verify"):
        code, doc = json_run(capsys, command, *trust, url)
        (report,) = doc["plan_sets"]
        assert code == 0 and report["status"] == "valid", doc
        assert report["signers"] == ["bake"]  # the name, as before
        assert_keyless(report["signed_by"], stack)
        (fact,) = report["keyless"]
        assert (fact["identity"], fact["issuer"]) == (IDENTITY, stack.issuer)
        assert fact["log_index"] == report["signed_by"][0]["log_index"] and fact["log_time"]
    code, doc = json_run(capsys, "ls", url)  # no keys: the claim, and no signer named
    assert code == 0 and doc["plan_sets"][0]["status"] == "unverified"
    assert doc["plan_sets"][0]["signed_by"] == [] and IDENTITY not in json.dumps(doc)


def test_a_key_signed_plan_set_keeps_its_report_and_adds_signed_by(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    generate_keypair(tmp_path / "ci", force=False, comment="ci")
    directory = baked(tmp_path / "bake", load_signer(str(tmp_path / "ci")))
    url = f"file://{tmp_path / 'store'}"
    code, _ = json_run(capsys, "push", str(directory), url, "--key", str(tmp_path / "ci"))
    assert code == 0
    code, doc = json_run(capsys, "verify", "--trusted-keys", str(tmp_path / "ci.pub"), url)
    (report,) = doc["plan_sets"]
    assert code == 0 and report["status"] == "valid" and report["signers"] == ["ci"]
    assert set(report) == SET_FIELDS | {"signed_by", "keyless"}
    assert (
        report["signed_by"] == [{"name": "ci", "keyid": doc["plans"][0]["signer_ids"][0]}]
        and report["keyless"] == []
    )


# -- compile caches -----------------------------------------------------------------------------


def test_a_keylessly_signed_compile_cache_names_its_identity_in_verify_ls_and_pull(
    capsys: pytest.CaptureFixture[str], stack: SigstoreStack, files: dict[str, Path], tmp_path: Path
) -> None:
    root = synthetic_cache(tmp_path / "vllm")
    code, doc = json_run(capsys, "compile-cache", "sign", "--key", "sigstore", str(root))
    assert code == 0 and doc["caches"][0]["action"] == "signed", doc
    assert doc["caches"][0]["signed_by"][0]["identity"] == IDENTITY
    trust = ("--trusted-keys", str(files["trusted"]), "--trusted-root", str(files["root"]))
    store = f"file://{tmp_path / 'store'}"
    code, doc = json_run(capsys, "compile-cache", "push", *trust, str(root), store)
    assert code == 0 and doc["caches"][0]["action"] == "pushed", doc
    pulled = tmp_path / "node"
    for argv, action in (
        (("verify", *trust, str(root)), "verified"),
        (("ls", *trust, str(root)), "verified"),
        (("pull", *trust, store, str(pulled)), "pulled"),
        (("pull", *trust, store, str(pulled)), "kept"),  # the local cache names its signer too
    ):
        code, doc = json_run(capsys, "compile-cache", *argv)
        (row,) = doc["caches"]
        assert code == 0 and (row["cache"], row["action"]) == (AOT, action), doc
        assert row["signers"] == ["bake"]
        assert_keyless(row["signed_by"], stack)
        assert row["keyless"][0]["identity"] == IDENTITY and row["keyless"][0]["log_time"]
    code, doc = json_run(capsys, "compile-cache", "ls", str(root))  # no keys: nothing named
    assert doc["caches"][0]["action"] == "unverified" and doc["caches"][0]["signed_by"] == []


def test_explain_names_a_keyless_compile_caches_identity(
    stack: SigstoreStack, files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """explain's compile-cache candidates say who signed each, as the reports do."""
    from plancache.pipeline.compile_cache.flows import publish_cache
    from plancache.pipeline.compile_cache.local_caches import CacheRoot
    from plancache.pipeline.explain import caches_in_root, explain_compile
    from plancache.pipeline.trust_config import trust_policy

    private = synthetic_cache(tmp_path / "private") / "torch_compile_cache" / AOT
    root = CacheRoot(tmp_path / "vllm")
    factors = {"env": {"A": "1"}, "config_hash": "c"}  # signed, as the plugin records them
    done = publish_cache(root, AOT, private, load_signer("sigstore"), utcnow(), key_factors=factors)
    assert done.action == "signed", done
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUSTED_ROOT", str(files["root"]))
    keyring = trust_policy(str(files["trusted"])).keyring
    assert keyring is not None
    (candidate,) = caches_in_root(root, keyring, utcnow())
    assert_keyless(list(candidate.signed_by), stack)
    verdict = explain_compile(0, {"env": {"A": "2"}, "config_hash": "c"}, [candidate])
    assert verdict["decision"] == "compile", verdict
    assert_keyless(verdict["candidates"][0]["signed_by"], stack)


def test_a_key_signed_compile_cache_keeps_its_row_and_adds_signed_by(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    root = synthetic_cache(tmp_path / "vllm")
    generate_keypair(tmp_path / "ci", force=False, comment="ci")
    assert (
        json_run(capsys, "compile-cache", "sign", "--key", str(tmp_path / "ci"), str(root))[0] == 0
    )
    code, doc = json_run(
        capsys, "compile-cache", "verify", "--trusted-keys", str(tmp_path / "ci.pub"), str(root)
    )
    (row,) = doc["caches"]
    assert code == 0 and row["action"] == "verified" and row["signers"] == ["ci"]
    assert set(row) == CACHE_FIELDS | {"signed_by", "keyless"}
    ((who),) = row["signed_by"]
    assert set(who) == {"name", "keyid"} and who["name"] == "ci"
    assert who["keyid"].startswith("SHA256:") and row["keyless"] == []
