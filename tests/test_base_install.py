"""A base install (``pip install plancache``, no extra) meets every URL scheme and key reference
with one line naming the extra that fixes it, never ``internal error``.

The base install is built from this environment, not mocked: the distributions plancache
requires without an extra (its ``Requires-Dist`` and theirs, read with importlib.metadata) are
linked into a directory of their own, and the CLI runs with ``python -S`` on that directory and
``src/`` alone, so exactly what a base install can import is importable (issue 50, item 6: an
``oci://`` URL once printed ``internal error: ModuleNotFoundError: No module named 'aiohttp'``).
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def _base_closure() -> set[str]:
    """Every distribution a base install of plancache pulls in (names canonicalised)."""
    seen: set[str] = set()
    todo = [
        Requirement(r)
        for r in metadata.requires("plancache") or []
        if Requirement(r).marker is None or Requirement(r).marker.evaluate({"extra": ""})
    ]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        for raw in metadata.requires(name) or []:
            dep = Requirement(raw)
            if dep.marker is None or dep.marker.evaluate({"extra": ""}):
                todo.append(dep)
    return seen


@pytest.fixture(scope="module")
def base_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding exactly the base install's importable distributions (links)."""
    site = tmp_path_factory.mktemp("base-site")
    for name in _base_closure():
        dist = metadata.distribution(name)
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            source = Path(str(dist.locate_file(top)))
            if top.startswith("..") or not source.exists() or (site / top).exists():
                continue
            (site / top).symlink_to(source)
    return site


def _cli(site: Path, tmp: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``plancache ARGS`` on the base install: (exit code, stderr)."""
    clean = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp),
        "PYTHONPATH": f"{SRC}{os.pathsep}{site}",
        "VLLM_CACHE_ROOT": str(tmp / "cache"),
        **(env or {}),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            "import sys; from plancache.cli.main import main; sys.exit(main())",
            *args,
        ],
        capture_output=True,
        text=True,
        env=clean,
        cwd=tmp,
        timeout=120,
    )
    return done.returncode, done.stderr


@pytest.fixture
def keys(base_site: Path, tmp_path: Path) -> Path:
    """A trusted-keys file with one real key (made by the base install's keygen)."""
    rc, err = _cli(base_site, tmp_path, "keygen", str(tmp_path / "k"))
    assert rc == 0, err
    return tmp_path / "k.pub"


def test_the_base_install_imports_no_extra(base_site: Path, tmp_path: Path) -> None:
    """The link farm is a base install: an extra's module is not importable through it, the
    core's are (so the cases below say something)."""
    modules = ("aiohttp", "s3fs", "fsspec", "cryptography")
    probe = f"import importlib.util as u; print([u.find_spec(m) is not None for m in {modules}])"
    out = subprocess.run(
        [sys.executable, "-S", "-c", probe],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": f"{SRC}{os.pathsep}{base_site}"},
        check=True,
    ).stdout.strip()
    assert out == "[False, False, True, True]"


URLS = [
    ("oci://127.0.0.1:9/fleet/plans", "oci"),
    ("s3://bucket/plans", "s3"),
    ("gs://bucket/plans", "gcs"),
    ("gcs://bucket/plans", "gcs"),
    ("az://container/plans", "azure"),
    ("abfs://container/plans", "azure"),
]


@pytest.mark.parametrize(("url", "extra"), URLS, ids=[u.split(":")[0] for u, _ in URLS])
def test_every_store_scheme_names_its_extra(
    base_site: Path, tmp_path: Path, keys: Path, url: str, extra: str
) -> None:
    for command in (
        ["verify", url, "--trusted-keys", str(keys)],
        ["ls", url],
        ["pull", url, "--trusted-keys", str(keys)],
    ):
        rc, err = _cli(base_site, tmp_path, *command)
        lines = err.strip().splitlines()
        assert rc == 2, (command, err)
        assert len(lines) == 1 and f"pip install 'plancache[{extra}]'" in lines[0], (command, err)
        assert "internal error" not in err


KEY_REFS = [
    ("pkcs11:token=ci;object=signer?module-path=/nonexistent.so&pin-value=1234", "pkcs11"),
    ("awskms:///arn:aws:kms:us-east-1:111122223333:key/abcd", "awskms"),
    ("gcpkms://projects/p/locations/l/keyRings/r/cryptoKeys/k/cryptoKeyVersions/1", "gcpkms"),
    ("sigstore", "sigstore"),
]


@pytest.mark.parametrize(("ref", "extra"), KEY_REFS, ids=[e for _, e in KEY_REFS])
def test_every_key_reference_names_its_extra(
    base_site: Path, tmp_path: Path, ref: str, extra: str
) -> None:
    plans = tmp_path / "plans"
    plans.mkdir()
    rc, err = _cli(base_site, tmp_path, "sign", str(plans), "--key", ref)
    assert rc == 2, err
    assert f"pip install 'plancache[{extra}]'" in err and "internal error" not in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_the_core_works_on_a_base_install(base_site: Path, tmp_path: Path) -> None:
    """Keys from a file and env://, a directory and a file:// store: no extra needed."""
    plans = tmp_path / "plans"
    plans.mkdir()
    rc, err = _cli(base_site, tmp_path, "keygen", str(tmp_path / "k"))
    assert rc == 0, err
    rc, err = _cli(base_site, tmp_path, "sign", str(plans), "--key", str(tmp_path / "k"))
    assert rc in (0, 1) and "internal error" not in err, err
    private = (tmp_path / "k").read_text()
    rc, err = _cli(
        base_site, tmp_path, "sign", str(plans), "--key", "env://KEY", env={"KEY": private}
    )
    assert rc in (0, 1) and "internal error" not in err, err
    rc, err = _cli(
        base_site,
        tmp_path,
        "verify",
        f"file://{tmp_path}/store",
        "--trusted-keys",
        str(tmp_path / "k.pub"),
    )
    assert rc == 2 and "does not exist" in err and "internal error" not in err, err


def test_a_sigstore_identity_in_trusted_keys_names_its_extra(
    base_site: Path, tmp_path: Path
) -> None:
    plans = tmp_path / "plans"
    plans.mkdir()
    keys = tmp_path / "trusted.pub"
    keys.write_text(
        "sigstore issuer=https://token.actions.githubusercontent.com "
        "identity=https://github.com/acme/serving/.github/workflows/bake.yml@refs/heads/main\n"
    )
    rc, err = _cli(base_site, tmp_path, "verify", str(plans), "--trusted-keys", str(keys))
    assert rc == 2 and "pip install 'plancache[sigstore]'" in err, err
    assert "internal error" not in err


@pytest.mark.parametrize(
    ("command", "extra"),
    [(["fingerprint", "--", "--model", "m"], "vllm"), (["completion", "bash"], "completion")],
    ids=["vllm", "completion"],
)
def test_commands_that_need_an_extra_name_it(
    base_site: Path, tmp_path: Path, command: list[str], extra: str
) -> None:
    rc, err = _cli(base_site, tmp_path, *command)
    assert rc == 2, err
    assert f"pip install 'plancache[{extra}]'" in err and "internal error" not in err, err


@pytest.mark.parametrize(
    ("location", "hint"),
    [
        ("oci:/registry.example/fleet", "did you mean 'oci://registry.example/fleet'?"),
        ("s3:bucket/plans", "did you mean 's3://bucket/plans'?"),
        ("oic://registry.example/fleet", "did you mean 'oci://'?"),
        ("s4://bucket/plans", "did you mean 's3://'?"),
    ],
)
def test_url_typos_are_named(
    base_site: Path, tmp_path: Path, keys: Path, location: str, hint: str
) -> None:
    """One slash is not a directory that does not exist, and an unknown scheme gets the nearest
    known one."""
    rc, err = _cli(base_site, tmp_path, "verify", location, "--trusted-keys", str(keys))
    assert rc == 2, err
    assert hint in err and len(err.strip().splitlines()) == 1, err
