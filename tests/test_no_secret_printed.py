"""No secret printed (issue 19 item 2): every command and journey, with planted secrets.

Credentials ride in locations and key references: URL userinfo (``s3://AK:SECRET@b``), SAS
``sig=``, ``token=``, presigned ``X-Amz-*``, ``pkcs11:…?pin-value=`` (also malformed,
``&pin-value:…``), a PIN file's contents, a bad ``PLANCACHE_STORAGE_OPTIONS`` item. Each
command runs with them, table and ``--json``, success or failure, and every byte of its stdout
and stderr is searched for each planted secret. The plugin's logger is checked the same way.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FP, plan_bytes
from plancache.cli.main import main
from plancache.storage.local.localdir import LocalPlanDir
from plancache.trust.display import redact, safe_text

SRC = str(Path(__file__).resolve().parent.parent / "src")
SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
SECRETS = (
    "AKSECRET1",
    "PWSECRET2",
    "SIGSECRET3",
    "TOKSECRET4",
    "FTPSECRET5",
    "PINSECRET6",
    "PINSECRET7",
    "AMZSECRET8",
    "OPTSECRET9",
    "FILEPINSECRET10",
    "GOOGSECRET11",
)
DEAD = "http://127.0.0.1:9"  # the discard port: nothing listens, a connection is refused at once
URLS = [
    "s3://AKSECRET1:PWSECRET2@bucket/plans",
    "az://container/plans?sv=2024&sig=SIGSECRET3",
    "gs://bucket/plans?token=TOKSECRET4",
    "ftp://user:FTPSECRET5@127.0.0.1:9/plans",
    "https://127.0.0.1:9/plans?X-Amz-Signature=AMZSECRET8&X-Amz-Credential=AKSECRET1",
    "s3://bucket/plans?X-Goog-Signature=GOOGSECRET11",
]


@pytest.fixture
def planted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> dict[str, str]:
    monkeypatch.setenv("AWS_ENDPOINT_URL", DEAD)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    assert main(["keygen", str(tmp_path / "ci")]) == 0
    plans = LocalPlanDir(tmp_path / "plans")
    plans.write(FP, plan_bytes(), None)
    pin = tmp_path / "pin"
    pin.write_text("FILEPINSECRET10\n")
    os.chmod(pin, 0o600)
    capsys.readouterr()
    return {
        "dir": str(plans.path),
        "pub": str(tmp_path / "ci.pub"),
        "key": str(tmp_path / "ci"),
        "tmp": str(tmp_path),
        "pkcs11": (
            "pkcs11:token=ci;object=signer?module-path=/nonexistent/libsofthsm2.so"
            "&pin-value=PINSECRET6"
        ),
        "pkcs11_bad": (
            "pkcs11:token=ci;object=signer?module-path=/nonexistent.so&pin-value:PINSECRET7"
        ),
        "pkcs11_file": (
            f"pkcs11:token=ci;object=signer?module-path=/nonexistent.so&pin-source=file:{pin}"
        ),
    }


def assert_clean(text: str, where: object) -> None:
    leaked = [s for s in SECRETS if s in text]
    assert not leaked, f"{where} printed {leaked}: {text[-2000:]}"


def _argvs(p: dict[str, str]) -> Iterator[list[str]]:
    trust = ["--trusted-keys", p["pub"]]
    for url in URLS:
        quick = ["--timeout", "1"]
        yield ["verify", *trust, *quick, url]
        yield ["ls", *quick, url]
        yield ["pull", *trust, *quick, url, f"{p['tmp']}/node"]
        yield ["push", "--key", p["key"], *quick, p["dir"], url]
        yield ["prune", "--older-than", "1d", *trust, *quick, url]
        yield ["compile-cache", "pull", *trust, *quick, url, f"{p['tmp']}/cc"]
        # an item that is no KEY=VALUE
        yield ["verify", *trust, "--storage-option", "OPTSECRET9", url]
        yield ["ls", "--timeout", f"{url}"]  # argparse echoes a bad value
    for ref in (p["pkcs11"], p["pkcs11_bad"], p["pkcs11_file"]):
        yield ["sign", "--key", ref, p["dir"]]
        yield ["pubkey", ref]
        yield ["push", "--key", ref, p["dir"], f"file://{p['tmp']}/store"]


def test_no_command_prints_a_planted_secret(
    planted: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    ran = 0
    for argv in _argvs(planted):
        for flags in ([], ["--json"]):
            full = (
                argv[:2] + flags + argv[2:]
                if argv[0] == "compile-cache"
                else argv[:1] + flags + argv[1:]
            )
            try:
                main(full)
            except SystemExit:
                pass
            out, err = capsys.readouterr()
            assert out or err, full
            assert_clean(out + err, full)
            ran += 1
    assert ran >= 100


def test_doctor_prints_no_secret_from_the_environment(
    planted: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VLLM_CACHE_ROOT", planted["tmp"])
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", planted["pub"])
    monkeypatch.setenv("PLANCACHE_TIMEOUT", "1")
    for url in [*URLS, "AKSECRET1:PWSECRET2@bucket/plans"]:  # the scheme forgotten
        for ref in (planted["pkcs11"], planted["pkcs11_bad"], planted["pkcs11_file"]):
            monkeypatch.setenv("PLANCACHE_URL", url)
            monkeypatch.setenv("PLANCACHE_SIGNING_KEY", ref)
            monkeypatch.setenv("PLANCACHE_STORAGE_OPTIONS", "endpoint_url=" + DEAD + " OPTSECRET9")
            for flags in ([], ["--json"]):
                main(["doctor", *flags])
                out, err = capsys.readouterr()
                assert "doctor" in out + err
                assert_clean(out + err, (url, ref, flags))


@pytest.mark.parametrize("journey", ["ci-bake.sh", "spot-boot.sh", "offline-audit.sh"])
def test_no_journey_prints_a_planted_secret(planted: dict[str, str], journey: str) -> None:
    """Each journey once per planted location and key reference. The runs share nothing: each has
    its own copy of the plan directory (so each signs and pushes as a fresh CI job does), its own
    image directory and audit report; they spend their time waiting on their unreachable stores'
    budgets, so they run side by side (a third of the time, one after another)."""

    def run(case: tuple[int, str, str]) -> tuple[tuple[str, str, str], str]:
        number, url, ref = case
        own = Path(planted["tmp"], f"journey-{number}")
        shutil.copytree(planted["dir"], own / "plans")
        env = {
            **os.environ,
            "PLANCACHE": f"{sys.executable} -m plancache.cli.main",
            "PYTHONPATH": SRC,
            "PLANCACHE_URL": url,
            "PLANCACHE_SIGNING_KEY": ref,
            "PLANCACHE_TRUSTED_KEYS": planted["pub"],
            "IMAGE_PLAN_DIR": str(own / "image"),
            "PLAN_DIR": str(own / "plans"),
            "PLANCACHE_TIMEOUT": "1",
            "AUDIT_JSON": str(own / "audit.json"),
        }
        done = subprocess.run(
            ["bash", str(SCRIPTS / journey)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        report = own / "audit.json"
        return (
            (journey, url, ref),
            done.stdout + done.stderr + (report.read_text() if report.exists() else ""),
        )

    refs = (planted["pkcs11"], planted["key"])
    cases = [(n, url, ref) for n, (url, ref) in enumerate((u, r) for u in URLS for r in refs)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        printed = list(pool.map(run, cases))
    assert len(printed) == len(URLS) * 2
    for where, text in printed:
        assert_clean(text, where)


def test_the_plugins_log_lines_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    """register() puts the one filter on the plugin's logger; what any plugin module logs there
    (the store URL on a store error, an SDK's message, a traceback) comes out redacted."""
    import plancache.vllm_plugin as plugin

    # the plugin is loaded; nothing else to install
    monkeypatch.setenv("PLANCACHE_COMPILE_CACHE", "0")
    monkeypatch.delenv("VLLM_ENABLE_STARTUP_PLAN", raising=False)
    plugin.register()
    logger = logging.getLogger("vllm.plancache")
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(logging.Formatter("%(message)s").format(record))

    keep = Keep()
    logger.addHandler(keep)
    try:
        for url in URLS:
            logger.error(
                "plancache: store %s: %s; vLLM profiles as usual", url, f"cannot open {url}"
            )
            try:
                raise OSError(f"connect failed for {url}")
            except OSError:
                logger.warning("plancache: push of plan %s to %s failed", FP, url, exc_info=True)
    finally:
        logger.removeHandler(keep)
    assert len(seen) == 2 * len(URLS) and all("plancache:" in line for line in seen)
    assert_clean("\n".join(seen), "the plugin's logger")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # Oracle Cloud object storage (ocifs): the bucket stands where userinfo would, and is shown
        (
            "oci://plans-bucket@axaxnpcrorw5/team/plans",
            "oci://plans-bucket@axaxnpcrorw5/team/plans",
        ),
        ("error: oci://my_bucket.v2@ns: gone", "error: oci://my_bucket.v2@ns: gone"),
        ("{'url': 'oci://b@ns'}", "{'url': 'oci://b@ns'}"),
        ("OCI://Bucket@Tenancy1/p", "OCI://Bucket@Tenancy1/p"),
        # real userinfo, in oci:// too: a password, a host with a dot or a port, an encoded byte
        ("oci://user:OCISECRET1@registry.example/team", "oci://***@registry.example/team"),
        ("oci://user:OCISECRET2@ns/p", "oci://***@ns/p"),
        ("oci://OCISECRET3@registry.example/plans", "oci://***@registry.example/plans"),
        ("oci://OCISECRET4@localhost:5000/plans", "oci://***@localhost:5000/plans"),
        ("oci://OCI%3ASECRET5@ns/p", "oci://***@ns/p"),
        ("oci://OCISECRET6@ns@evil/p", "oci://***@ns@evil/p"),
        ("https://user:PWSECRET7@host/x", "https://***@host/x"),
        ("https://TOKSECRET8@github.com/x", "https://***@github.com/x"),
        ("s3://AKSECRET9:SKSECRET10@bucket/plans", "s3://***@bucket/plans"),
        ("gs://TOKSECRET11@namespace/p", "gs://***@namespace/p"),
    ],
)
def test_an_ocifs_bucket_is_shown_and_userinfo_is_masked(text: str, shown: str) -> None:
    assert redact(text) == shown and safe_text(text, 500) == shown and redact(shown) == shown
    assert not re.search(r"SECRET\d", shown)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["oci", "OCI", "s3", "https", "az"]),
    st.text(alphabet="abcXYZ019._-%", min_size=1, max_size=12),
    st.text(alphabet="abcXYZ019._-!$~+*", min_size=1, max_size=12),
    st.sampled_from(["ns", "registry.example", "127.0.0.1:5000", "localhost"]),
)
def test_a_password_in_a_urls_userinfo_never_shows(
    scheme: str, user: str, password: str, host: str
) -> None:
    secret = f"SECRET{password}"
    out = safe_text(f"cannot open {scheme}://{user}:{secret}@{host}/plans: refused", 500)
    assert secret not in out and "***@" in out, out


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("oci://plans-bucket@axaxnpcrorw5/team", "oci://plans-bucket@axaxnpcrorw5/team"),
        ("oci://user:OCISECRET12@registry.example/team", "oci://***@registry.example/team"),
    ],
)
def test_an_ocifs_url_in_an_error_line_keeps_its_bucket(
    url: str, shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """fsspec maps ``oci://`` with an ``@`` to Oracle Cloud object storage (ocifs, not
    installed here): the error line names the store as given, its bucket included; a
    ``user:token`` is still masked."""
    assert main(["ls", "--timeout", "5", url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{shown}:" in err and "SECRET" not in err, err
