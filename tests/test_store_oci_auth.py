"""Registry credentials where registries keep them, TLS with a custom CA, and no secret shown.

The TLS registry is docker-registry with a self-signed certificate for 127.0.0.1 and an
htpasswd file (tests/registry_server.py); the bearer-token registry is tests/registry_stub.py
with its token service.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import FP, plan_bytes
from plancache.cli.main import main
from plancache.storage.oci.access.credential_files import find_credentials
from plancache.storage.store import open_store
from plancache.trust.errors import ConfigError, PlanCacheError
from plancache.trust.plans.plan import plan_name, sig_name
from registry_server import PASSWORD, USER, DockerRegistry
from registry_stub import RegistryStub
from store_servers import (
    tls_registry,  # noqa: F401 - a fixture, named as a parameter
)

AUTH = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


@pytest.fixture(autouse=True)
def no_ambient_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker"))
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)


def write_config(path: Path, registry: str, **entry: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"auths": {registry: entry}}))
    return path


def round_trip(url: str, ca: Path | None, **options: object) -> None:
    opts = {**({"ca_file": str(ca)} if ca else {}), **options}
    store = open_store(url, opts, timeout=30)
    store.put_many({plan_name(FP): plan_bytes(), sig_name(FP): b"sig"})
    got = store.fetch(FP)
    assert (got.plan_bytes, got.sig_bytes) == (plan_bytes(), b"sig")


def test_docker_config_from_DOCKER_CONFIG_over_tls_with_a_custom_ca(
    tls_registry: DockerRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_config(tmp_path / "docker" / "config.json", tls_registry.host, auth=AUTH)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    round_trip(tls_registry.url(tls_registry.new_repository()), tls_registry.ca)


def test_registry_auth_file_and_a_credential_helper(
    tls_registry: DockerRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth_json = write_config(
        tmp_path / "auth.json", f"https://{tls_registry.host}", username=USER, password=PASSWORD
    )
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(auth_json))
    round_trip(tls_registry.url(tls_registry.new_repository()), tls_registry.ca)
    monkeypatch.delenv("REGISTRY_AUTH_FILE")
    helper = tmp_path / "bin" / "docker-credential-plancachetest"
    helper.parent.mkdir()
    helper.write_text(
        "#!/bin/sh\nread server\n"
        f'printf \'{{"ServerURL":"%s","Username":"{USER}","Secret":"{PASSWORD}"}}\' "$server"\n'
    )
    helper.chmod(helper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{helper.parent}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "config.json").write_text(
        json.dumps({"credHelpers": {tls_registry.host: "plancachetest"}})
    )
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    creds = asyncio.run(find_credentials(tls_registry.host))
    assert creds.username == USER and PASSWORD not in repr(creds)
    round_trip(tls_registry.url(tls_registry.new_repository()), tls_registry.ca)


def test_wrong_or_missing_credentials_are_one_line_without_the_secret(
    tls_registry: DockerRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = tls_registry.url(tls_registry.new_repository())
    with pytest.raises(PlanCacheError) as err:
        round_trip(url, tls_registry.ca)
    assert "no credentials were found" in err.value.detail
    wrong = base64.b64encode(f"{USER}:not-{PASSWORD}".encode()).decode()
    config = write_config(tmp_path / "wrong.json", tls_registry.host, auth=wrong)
    code = main(
        [
            *("ls", url, "--storage-option", f"ca_file={tls_registry.ca}"),
            *("--storage-option", f"auth_file={config}"),
        ]
    )
    out, err_text = capsys.readouterr()
    assert code != 0 and "refused the credentials" in out + err_text
    assert PASSWORD not in out + err_text and wrong not in out + err_text
    assert "Traceback" not in err_text


def test_plain_http_only_for_loopback_or_when_asked() -> None:
    fs = open_store(
        "oci://registry.example/team/plans", {"mirror": "http://mirror.example"}
    ).backend
    assert fs.origin.base == "https://registry.example"  # the mirror's scheme is its own
    assert fs.reader.base == "http://mirror.example"
    fs = open_store("oci://registry.example/team/plans", {"plain_http": True}).backend  # asked for
    assert fs.origin.base == "http://registry.example"
    with pytest.raises(ConfigError):
        open_store("oci://127.0.0.1:5000/a", {"colour": "blue"})


@pytest.fixture
def bearer_stub() -> Iterator[RegistryStub]:
    server = RegistryStub()
    server.state.bearer = AUTH
    yield server
    server.stop()


def test_bearer_token_dance(
    bearer_stub: RegistryStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_config(tmp_path / "docker" / "config.json", bearer_stub.host, auth=AUTH)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    round_trip(bearer_stub.url("team/plans"), None)
    tokens = [h for m, p, h in bearer_stub.state.requests if p.startswith("/token")]
    assert tokens and all(h.get("Authorization") == f"Basic {AUTH}" for h in tokens)
    assert len(tokens) <= 3  # one per scope (pull; pull,push), reused while valid


def test_an_identity_token_is_an_oauth2_refresh_grant_and_never_shown(
    bearer_stub: RegistryStub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docker's ``identitytoken`` (what ``docker login`` keeps for OAuth registries: ACR, GAR):
    a POST to the realm with ``grant_type=refresh_token``, never Basic credentials."""
    refresh = "refresh-4711-not-a-real-token"
    bearer_stub.state.refresh_token = refresh
    config = write_config(
        tmp_path / "docker" / "config.json", bearer_stub.host, identitytoken=refresh
    )
    monkeypatch.setenv("DOCKER_CONFIG", str(config.parent))
    round_trip(bearer_stub.url("team/plans"), None)
    tokens = [(m, h) for m, p, h in bearer_stub.state.requests if p.startswith("/token")]
    assert tokens and all(m == "POST" and "Authorization" not in h for m, h in tokens)
    form = bearer_stub.state.token_forms[0]
    assert form["grant_type"] == "refresh_token" and form["refresh_token"] == refresh
    assert form["service"] == "stub" and form["scope"].startswith("repository:")
    write_config(config, bearer_stub.host, identitytoken="expired-" + refresh)
    code = main(["ls", bearer_stub.url("team/plans")])
    out, err = capsys.readouterr()
    assert code != 0 and "token service" in out + err and "answered 401" in out + err
    assert refresh not in out + err and "Traceback" not in err


def test_a_bearer_token_expires_on_the_stores_clock(
    bearer_stub: RegistryStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token is reused until its ``expires_in`` (300 s from the stub, less a margin) has passed
    on the store's clock, the injectable one (issue 50: nothing reads ``time.monotonic()`` to
    decide), then asked for again."""
    from fake_clock import FakeClock
    from plancache.clock import Deadline

    write_config(tmp_path / "docker" / "config.json", bearer_stub.host, auth=AUTH)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    clock = FakeClock()
    store = open_store(bearer_stub.url("team/plans"), None, 30, deadline=Deadline.after(30, clock))
    store.put_many({plan_name(FP): plan_bytes(), sig_name(FP): b"sig"})

    def tokens() -> int:
        return sum(1 for _, p, _ in bearer_stub.state.requests if p.startswith("/token"))

    store.fetch(FP)
    before = tokens()
    clock.advance(200)
    store.fetch(FP)
    assert tokens() == before  # still valid on this clock
    clock.advance(200)
    store.fetch(FP)
    assert tokens() > before  # expired on this clock, whatever the real time says
