"""What the CLI test files share: run the CLI in-process, an S3 endpoint in the environment, a CI
key."""

from __future__ import annotations

from pathlib import Path

import pytest

from plancache.cli.main import main
from plancache.keys.keyfile import generate_keypair
from store_servers import (
    AWS_ENV,
    MotoServer,
    moto_server,  # noqa: F401 - a fixture, named as a parameter
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``plancache ARGV`` in this process: exit code, stdout, stderr (argparse's exits included)."""
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def s3(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> MotoServer:
    """moto's S3 server, reached through ``AWS_ENDPOINT_URL`` as a user's environment would."""
    for key, value in {**AWS_ENV, "AWS_ENDPOINT_URL": moto_server.endpoint}.items():
        monkeypatch.setenv(key, value)
    return moto_server


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    """A fresh CI signing key ``ci`` (and ``ci.pub``) in the test's directory."""
    generate_keypair(tmp_path / "ci", force=False, comment="ci")
    return tmp_path / "ci"
