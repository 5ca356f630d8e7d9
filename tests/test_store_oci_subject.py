"""The image as a first-class argument, tried as a new user would, on Debian's docker-registry:
``--subject`` on every command that reads or audits, ``ls --subject`` of a bare image, ``push
--subject`` of an image that is not there, and TLS mistakes that name their fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FP, plan_bytes
from plancache.cli.main import main
from plancache.keys.keyfile import generate_keypair
from plancache.storage.local.localdir import LocalPlanDir
from plancache.trust.plans.plan import plan_name, sig_name
from registry_server import DockerRegistry
from store_servers import (
    registry,  # noqa: F401 - a fixture, named as a parameter
    tls_registry,  # noqa: F401 - a fixture, named as a parameter
)
from test_store_oci_referrers import push_image

JOURNEYS = Path(__file__).resolve().parent.parent / "src" / "plancache" / "journeys"


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    generate_keypair(tmp_path / "ci", force=False, comment="ci")
    LocalPlanDir(tmp_path / "ci-plans").write(FP, plan_bytes(), None)
    return tmp_path / "ci"


def test_subject_on_every_command_that_reads_or_audits(
    registry: DockerRegistry, keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = registry.new_repository("subject")
    url = registry.url(repo)
    push_image(registry.endpoint, repo, "v1")
    push_image(registry.endpoint, repo, "v2")
    assert (
        main(["push", "--key", str(keys), "--subject", "v1", str(tmp_path / "ci-plans"), url]) == 0
    )
    trusted = ["--trusted-keys", f"{keys}.pub"]
    spot = tmp_path / "spot"
    assert main(["pull", *trusted, "--subject", "v1", url, str(spot)]) == 0
    assert (spot / plan_name(FP)).read_bytes() == plan_bytes()
    assert main(["verify", *trusted, "--subject", "v1", url]) == 0
    assert main(["verify", *trusted, "--subject", "v2", url]) == 1  # nothing attached to v2
    capsys.readouterr()
    assert main(["inspect", "--json", *trusted, "--subject", "v1", f"{url}/{plan_name(FP)}"]) == 0
    assert json.loads(capsys.readouterr().out)["fingerprint"] == FP
    assert main(["prune", "--dry-run", "--unsigned", *trusted, "--subject", "v1", url]) == 0
    env = {
        **os.environ,
        "PLANCACHE_URL": url,
        "PLANCACHE_TRUSTED_KEYS": f"{keys}.pub",
        "PLANCACHE_IMAGE": "v2",  # the journeys hand it on as --subject
        "PLANCACHE_STRICT": "1",
        "PLANCACHE_FINGERPRINTS": FP,
        "PLAN_DIR": str(tmp_path / "spot-journey"),
        "PLANCACHE": f"{sys.executable} -m plancache.cli.main",
    }
    boot = subprocess.run(
        ["bash", str(JOURNEYS / "spot-boot.sh")], env=env, capture_output=True, text=True
    )
    assert boot.returncode == 1, boot.stderr  # v2 has nothing attached: a miss, not v1's plan
    audit = subprocess.run(
        ["bash", str(JOURNEYS / "offline-audit.sh")],
        env={**env, "PLANCACHE_IMAGE": "v1"},
        capture_output=True,
        text=True,
    )
    assert audit.returncode == 0, audit.stderr


def test_ls_subject_of_a_bare_image_says_nothing_is_attached(
    registry: DockerRegistry, keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = registry.new_repository("bare")
    url = registry.url(repo)
    push_image(registry.endpoint, repo, "v1")
    assert main(["push", "--key", str(keys), str(tmp_path / "ci-plans"), url]) == 0  # untied
    capsys.readouterr()
    main(["ls", "--subject", "v1", url])
    err = capsys.readouterr().err
    assert "nothing is attached to image v1" in err and "no plans" not in err


def test_push_subject_of_a_missing_image_signs_nothing(
    registry: DockerRegistry, keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = registry.new_repository("missing")
    plans = tmp_path / "ci-plans"
    capsys.readouterr()
    code = main(["push", "--key", str(keys), "--subject", "v9", str(plans), registry.url(repo)])
    assert code == 2
    assert ":v9: no such image in" in capsys.readouterr().err
    assert not (plans / sig_name(FP)).exists()  # nothing was signed


@pytest.mark.parametrize("command", ["prune", "pull", "push"])
def test_an_empty_subject_is_a_config_error_not_the_whole_repository(
    registry: DockerRegistry,
    keys: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    """Red team 47b: ``--subject "$IMAGE"`` with the variable unset was dropped, so ``prune``
    judged (and deleted) every plan of the repository, not the image's."""
    repo = registry.new_repository("empty-subject")
    url = registry.url(repo)
    plans = tmp_path / "ci-plans"
    assert main(["push", "--allow-unsigned", str(plans), url]) == 0  # not attached to anything
    capsys.readouterr()
    argv = {
        "prune": ["prune", "--unsigned", "--subject", "", url],
        "pull": [
            "pull",
            "--trusted-keys",
            f"{keys}.pub",
            "--subject",
            "",
            url,
            str(tmp_path / "d"),
        ],
        "push": ["push", "--key", str(keys), "--subject", " ", str(plans), url],
    }[command]
    assert main(argv) == 2
    assert "--subject is empty" in capsys.readouterr().err
    assert registry.get(f"/v2/{repo}/manifests/{plan_name(FP)}")[0] == 200  # nothing deleted
    assert not (plans / sig_name(FP)).exists()  # nothing signed
    assert not (tmp_path / "d").exists()


def test_tls_spoken_to_a_plain_http_registry_names_plain_http(
    registry: DockerRegistry, capsys: pytest.CaptureFixture[str]
) -> None:
    url = registry.url(registry.new_repository("tls"))
    assert main(["ls", "--storage-option", "plain_http=false", url]) == 2
    err = capsys.readouterr().err
    assert "WRONG_VERSION_NUMBER" in err and "plain_http=true" in err


def test_an_untrusted_certificate_names_ca_file(
    tls_registry: DockerRegistry, capsys: pytest.CaptureFixture[str]
) -> None:
    url = tls_registry.url(tls_registry.new_repository("tls"))
    assert main(["ls", "--storage-option", "plain_http=false", url]) == 2
    err = capsys.readouterr().err
    assert "CERTIFICATE_VERIFY_FAILED" in err and "ca_file=PATH" in err and "SSL_CERT_FILE" in err


@pytest.mark.parametrize("word", ["CERTIFICATE_VERIFY_FAILED", "WRONG_VERSION_NUMBER"])
def test_a_plain_http_answer_cannot_name_a_tls_fix(
    word: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Red team 47b: the TLS fix was chosen by the words in any error's text, so a plain-HTTP
    registry's malformed status line carrying ``CERTIFICATE_VERIFY_FAILED`` told the operator
    to give a CA file (and ``WRONG_VERSION_NUMBER`` to set plain_http on a plain connection)."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def answer() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(f"HTTP/1.1 2x0 {word}\r\nContent-Length: 0\r\n\r\n".encode())

    threading.Thread(target=answer, daemon=True).start()
    try:
        url = f"oci://127.0.0.1:{listener.getsockname()[1]}/plancache/x"
        assert main(["ls", "--timeout", "5", url]) == 2
    finally:
        listener.close()
    err = capsys.readouterr().err
    assert "ca_file" not in err and "plain_http=true" not in err
    assert "Bad status line" in err  # the real failure, as it was
