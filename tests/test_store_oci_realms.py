"""Where a registry's credentials may go, and what may not block the loop while they are found
(issue 47, items 1, 5 and 7).

* A secret (basic credentials, an identity token) goes to a token realm only over TLS or on
  loopback, and only on the registry's own host or one listed in ``token_realms``; a refused
  realm is a ``store-error`` naming it, and the realm's host receives nothing. The plain-HTTP
  cases need hosts that are not loopback: they run in a child in a network namespace of its own
  (``unshare -rn``, addresses on its ``lo``), which sends nothing anywhere else.
* Credential files and helpers, and CA files, are read so that nothing waits on a FIFO, a
  helper that never answers or one that writes without end: a FIFO is refused, a helper is
  killed when the operation ends and its output is capped as it is read.
* A TLS registry on loopback spoken to in plain HTTP (the loopback default) says so.

The registries are tests/registry_stub.py (its token service, a realm named on demand) and
Debian's docker-registry with TLS (tests/registry_server.py).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import FP, plan_bytes
from plancache.cli.main import main
from plancache.storage.store import Store, open_store
from plancache.trust.errors import ConfigError, PlanCacheError
from plancache.trust.plans.plan import plan_name, sig_name
from registry_server import DockerRegistry
from registry_stub import RegistryStub
from store_servers import (
    tls_registry,  # noqa: F401 - a fixture, named as a parameter
)

USER, PASSWORD = "ci", "not-a-real-secret-4711"  # a throwaway test credential
AUTH = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
HANG_GUARD = 120.0
"""Seconds before a hung child or thread fails the test: a guard, not a time measurement."""


@pytest.fixture(autouse=True)
def no_ambient_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)


def docker_config(tmp_path: Path, content: dict[str, object]) -> Path:
    path = tmp_path / "docker" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content))
    return path


@pytest.fixture
def stubs() -> Iterator[tuple[RegistryStub, RegistryStub]]:
    """The registry (127.0.0.1) and a token service on another loopback host (127.0.0.2)."""
    registry, other = RegistryStub(), RegistryStub(address="127.0.0.2")
    registry.state.bearer = other.state.bearer = AUTH
    registry.state.realm = f"http://{other.host}/token"
    yield registry, other
    registry.stop()
    other.stop()


def fetch_error(store: Store) -> PlanCacheError:
    """The error of reading FP (a read's failure is its result's, not raised)."""
    error = store.fetch(FP).error
    assert error is not None
    return error


def put_and_read(url: str, **options: object) -> None:
    store = open_store(url, dict(options), timeout=30)
    store.put_many({plan_name(FP): plan_bytes(), sig_name(FP): b"sig"})
    assert store.fetch(FP).plan_bytes == plan_bytes()


def test_credentials_go_to_no_token_realm_on_another_host_unless_listed(
    stubs: tuple[RegistryStub, RegistryStub], tmp_path: Path
) -> None:
    registry, other = stubs
    docker_config(tmp_path, {"auths": {registry.host: {"auth": AUTH}}})
    with pytest.raises(PlanCacheError) as err:
        put_and_read(registry.url("team/plans"))
    assert err.value.reason.value == "store-error"
    assert other.host in err.value.detail and "token_realms=127.0.0.2" in err.value.detail
    assert other.state.requests == []  # not even asked
    put_and_read(registry.url("team/plans"), token_realms="127.0.0.2")
    tokens = [h for _, p, h in other.state.requests if p.startswith("/token")]
    assert tokens and all(h.get("Authorization") == f"Basic {AUTH}" for h in tokens)


def test_without_credentials_a_token_is_asked_for_anonymously_from_any_acceptable_realm(
    stubs: tuple[RegistryStub, RegistryStub],
) -> None:
    registry, other = stubs
    registry.state.bearer = other.state.bearer = ""  # anonymous tokens
    put_and_read(registry.url("team/plans"))
    assert [p for _, p, _ in other.state.requests if p.startswith("/token")]


@pytest.mark.parametrize("realm", ["https://exa_mple.test/token", "https://a.test:99999/token"])
def test_a_hostile_realm_is_a_store_error_naming_the_realm(
    stubs: tuple[RegistryStub, RegistryStub],
    realm: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    registry, _ = stubs
    registry.state.realm = realm
    assert main(["ls", "--json", registry.url("team/plans")]) != 0
    report = json.loads(capsys.readouterr().out)
    assert report["error"]["reason"] == "store-error"
    assert realm in report["error"]["detail"]


CHILD = textwrap.dedent(
    """
    import base64, json, os, subprocess, sys, tempfile
    for argv in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", "10.9.9.9/32", "dev",
                 "lo"], ["ip", "addr", "add", "10.9.9.10/32", "dev", "lo"]):
        subprocess.run(argv, check=True)
    from registry_stub import RegistryStub
    from plancache.storage.store import Store, open_store
    from plancache.trust.errors import PlanCacheError
    auth = sys.argv[1]
    registry = RegistryStub(address="10.9.9.9")
    other = RegistryStub(address="10.9.9.10")
    registry.state.bearer = other.state.bearer = auth
    home = tempfile.mkdtemp()
    os.environ["DOCKER_CONFIG"] = home
    outcome = {}
    for name, realm, entry in [
        ("own-host", f"http://{registry.host}/token", {"auth": auth}),
        ("other-host", f"http://{other.host}/token", {"auth": auth}),
        ("identity-token", f"http://{registry.host}/token", {"identitytoken": "refresh-4711"}),
    ]:
        registry.state.realm = realm
        with open(os.path.join(home, "config.json"), "w") as f:
            json.dump({"auths": {registry.host: entry}}, f)
        store = open_store(registry.url("team/plans"), {"plain_http": True}, timeout=10)
        error = store.fetch("0123456789abcdef").error
        outcome[name] = [error.reason.value, error.detail] if error else ["ok", ""]
    asked = registry.state.requests + other.state.requests
    tokens = [r for r in asked if r[1].startswith("/token")]
    outcome["token-requests"] = len(tokens)
    registry.state.bearer = ""  # anonymous tokens: nothing secret to send
    registry.state.realm = None
    os.remove(os.path.join(home, "config.json"))
    store = open_store(registry.url("team/plans"), {"plain_http": True}, timeout=10)
    error = store.fetch("0123456789abcdef").error
    outcome["anonymous"] = [error.reason.value, error.detail] if error else ["ok", ""]
    print(json.dumps(outcome))
    """
)


def in_own_network(child: str) -> dict[str, Any]:
    """The JSON last printed by ``child`` (Python, given AUTH) run in a network namespace of
    its own (``unshare -rn``); the test is skipped where none can be made (failed in CI)."""
    usable = shutil.which("unshare") is not None and shutil.which("ip") is not None
    if usable:
        probe = ["unshare", "-rn", "ip", "link", "set", "lo", "up"]
        usable = subprocess.run(probe, capture_output=True, check=False).returncode == 0
    if not usable:
        if os.environ.get("CI") == "true":
            pytest.fail("this test needs a network namespace (unshare -rn, iproute2) in CI")
        pytest.skip("needs a network namespace of its own (unshare -rn, iproute2)")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(SRC), str(TESTS)]),
        "HOME": os.environ.get("HOME", "/tmp"),
    }
    done = subprocess.run(
        ["unshare", "-rn", sys.executable, "-c", child, AUTH],
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG_GUARD,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    outcome: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return outcome


def test_a_plain_http_realm_off_loopback_never_gets_a_secret_whatever_plain_http_says() -> None:
    """In a network namespace of its own: a registry at 10.9.9.9 spoken to in plain HTTP (as
    asked, ``plain_http=true``) whose realm is plain HTTP, on its own host or another: neither
    the basic credentials nor the identity token is sent; an anonymous token still is asked."""
    outcome = in_own_network(CHILD)
    for case in ("own-host", "other-host", "identity-token"):
        reason, detail = outcome[case]
        assert reason == "store-error" and "plain HTTP" in detail, (case, detail)
        assert "not sent" in detail and PASSWORD not in detail and "refresh-4711" not in detail
    assert outcome["token-requests"] == 0
    assert outcome["anonymous"][0] in ("ok", "no-plan"), outcome["anonymous"]


TLS_REALM_CHILD = textwrap.dedent(
    """
    import json, os, subprocess, sys, tempfile
    from pathlib import Path
    for argv in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", "10.9.9.9/32", "dev",
                 "lo"]):
        subprocess.run(argv, check=True)
    from registry_stub import RegistryStub
    from store_servers import self_signed
    from plancache.storage.store import open_store
    auth = sys.argv[1]
    home = Path(tempfile.mkdtemp())
    tls = self_signed(home, "realm", "10.9.9.9")
    os.environ["SSL_CERT_FILE"] = str(tls[0])  # the realm's certificate is trusted
    os.environ["DOCKER_CONFIG"] = str(home)
    registry = RegistryStub(address="10.9.9.9")
    realm = RegistryStub(address="10.9.9.9", tls=tls)
    registry.state.bearer = realm.state.bearer = auth
    registry.state.realm = f"https://{realm.host}/token"
    outcome = {}
    # the last: the stub as a plain-HTTP mirror (as its own configuration says) of a TLS
    # registry that is never asked (reads go to the mirror), the mirror's own credentials
    mirrored = ("oci://10.9.9.9:1/team/plans", {"mirror": f"http://{registry.host}"})
    for name, entry, (url, options) in [
        ("basic", {"auth": auth}, (registry.url("team/plans"), {"plain_http": True})),
        ("identity-token", {"identitytoken": "refresh-4711"},
         (registry.url("team/plans"), {"plain_http": True})),
        ("plain-mirror", {"auth": auth}, mirrored),
    ]:
        realm.state.refresh_token = "refresh-4711" if name == "identity-token" else None
        (home / "config.json").write_text(json.dumps({"auths": {registry.host: entry}}))
        store = open_store(url, options, timeout=10)
        error = store.fetch("0123456789abcdef").error
        outcome[name] = [error.reason.value, error.detail] if error else ["ok", ""]
    outcome["registry-saw"] = [h.get("Authorization", "") for _, _, h in registry.state.requests]
    outcome["realm-saw"] = [h.get("Authorization", "") for _, _, h in realm.state.requests]
    outcome["realm-forms"] = realm.state.token_forms
    print(json.dumps(outcome))
    """
)


def test_no_token_bought_with_the_credentials_goes_over_plain_http_off_loopback() -> None:
    """In a network namespace of its own: a registry at 10.9.9.9 spoken to in plain HTTP
    (``plain_http=true``) names a TLS realm on its own host. The credentials could go to the
    realm (TLS), but the token they buy (push, delete) would then travel in clear to the
    registry on every request: they are not used, a store-error says why, and neither the
    realm nor the registry is sent anything secret. Before, the registry received
    ``Authorization: Bearer …`` bought with the docker config's password, or with its
    identity token, in clear. The same for a plain-HTTP mirror (``http://`` in its own
    configuration) and the credentials kept for the mirror's host."""
    outcome = in_own_network(TLS_REALM_CHILD)
    for case in ("basic", "identity-token", "plain-mirror"):
        reason, detail = outcome[case]
        assert reason == "store-error" and "plain HTTP" in detail, (case, detail)
        assert "not sent" in detail and PASSWORD not in detail and "refresh-4711" not in detail
    assert not any(outcome["registry-saw"]), outcome["registry-saw"]
    assert outcome["realm-saw"] == [] and outcome["realm-forms"] == []


# -- nothing blocks the loop --------------------------------------------------------------------


def test_a_fifo_as_the_docker_config_is_refused_not_waited_on(
    stubs: tuple[RegistryStub, RegistryStub], tmp_path: Path
) -> None:
    registry, _ = stubs
    fifo = tmp_path / "docker" / "config.json"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    error = fetch_error(open_store(registry.url("team/plans"), timeout=10))
    assert isinstance(error, ConfigError) and "not a regular file" in error.detail


def helper(tmp_path: Path, body: str) -> None:
    """``docker-credential-slow`` on PATH, named by the docker config's ``credsStore``."""
    program = tmp_path / "bin" / "docker-credential-slow"
    program.parent.mkdir(exist_ok=True)
    program.write_text("#!/bin/sh\n" + body)
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    os.environ["PATH"] = f"{program.parent}{os.pathsep}{os.environ['PATH']}"
    docker_config(tmp_path, {"credsStore": "slow"})


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead: not yet reaped by its parent
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_helper_that_outlives_the_operation_is_killed(
    stubs: tuple[RegistryStub, RegistryStub],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry, _ = stubs
    monkeypatch.setenv("PATH", os.environ["PATH"])  # restored after the test
    pid_file = tmp_path / "helper.pid"
    helper(tmp_path, f"echo $$ > {pid_file}\nexec sleep 600\n")
    error = fetch_error(open_store(registry.url("team/plans"), timeout=1))
    assert error.reason.value == "timeout"
    for _ in range(200):  # the kill follows the cancellation on the store's loop
        if pid_file.exists() and not alive(int(pid_file.read_text())):
            break
        time.sleep(0.05)
    assert pid_file.exists() and not alive(int(pid_file.read_text()))


def test_a_helper_whose_child_holds_its_pipe_ends_at_the_helpers_timeout(
    stubs: tuple[RegistryStub, RegistryStub],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A helper that never answers and forked a child holding its stdout: it is killed at
    HELPER_TIMEOUT with its process group, so the pipe closes and the read ends there (one
    line naming the helper), not at the operation's budget (the reap waited for the pipe the
    grandchild held, past the 5 s, until the deadline); the grandchild is gone too."""
    registry, _ = stubs
    monkeypatch.setenv("PATH", os.environ["PATH"])
    pid_file = tmp_path / "grandchild.pid"
    helper(tmp_path, f"sleep 600 &\necho $! > {pid_file}\nexec sleep 600\n")
    error = fetch_error(open_store(registry.url("team/plans"), timeout=60))
    grandchild = int(pid_file.read_text())
    try:
        assert error.reason.value == "store-error", error.detail
        assert "docker-credential-slow did not answer in 5 s" in error.detail
        for _ in range(200):
            if not alive(grandchild):
                break
            time.sleep(0.05)
        assert not alive(grandchild)
    finally:
        if alive(grandchild):
            os.kill(grandchild, 9)


def test_a_helper_that_waits_blocks_no_other_store_on_the_loop(
    stubs: tuple[RegistryStub, RegistryStub],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While one store's helper has not answered, another store (same fsspec loop) still reads:
    the helper runs as an asyncio subprocess, not ``subprocess.run`` on the loop (which held it
    for the helper's whole 5 s, past a 3 s boot budget)."""
    registry, _ = stubs
    monkeypatch.setenv("PATH", os.environ["PATH"])
    pid_file, release = tmp_path / "helper.pid", tmp_path / "release"
    helper(tmp_path, f"echo $$ > {pid_file}\nwhile [ ! -e {release} ]; do sleep 0.05; done\n")
    waiting = threading.Thread(
        target=lambda: open_store(registry.url("team/plans"), timeout=60).fetch(FP), daemon=True
    )
    waiting.start()
    for _ in range(int(HANG_GUARD / 0.05)):
        if pid_file.exists():
            break
        time.sleep(0.05)
    open_registry = RegistryStub()  # no login wanted
    try:
        result = open_store(open_registry.url("team/plans"), timeout=3).fetch(FP)
        assert result.error is None and result.missing
    finally:
        release.touch()
        open_registry.stop()
        waiting.join(HANG_GUARD)


def test_a_helper_that_writes_without_end_is_cut_at_the_cap(
    stubs: tuple[RegistryStub, RegistryStub],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry, _ = stubs
    monkeypatch.setenv("PATH", os.environ["PATH"])
    helper(tmp_path, "exec cat /dev/zero\n")  # endless: only a capped read ends
    error = fetch_error(open_store(registry.url("team/plans"), timeout=30))
    assert isinstance(error, ConfigError) and "answered more than 65536 bytes" in error.detail


def test_a_fifo_named_as_a_mirrors_ca_is_refused_at_once(tmp_path: Path) -> None:
    hosts = tmp_path / "certs.d" / "registry.example" / "hosts.toml"
    hosts.parent.mkdir(parents=True)
    hosts.write_text('[host."https://mirror.example"]\n  ca = "ca.pem"\n')
    os.mkfifo(hosts.parent / "ca.pem")
    outcome: list[BaseException] = []

    def opening() -> None:
        try:
            open_store("oci://registry.example/team/plans", {"mirror_config": str(hosts)})
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=opening, daemon=True)
    thread.start()
    thread.join(HANG_GUARD)
    assert not thread.is_alive(), "the open waited on a FIFO"
    assert isinstance(outcome[0], ConfigError) and "not a regular file" in outcome[0].detail


# -- clear lines --------------------------------------------------------------------------------


def test_a_tls_registry_on_loopback_spoken_to_in_http_says_so(
    tls_registry: DockerRegistry, capsys: pytest.CaptureFixture[str]
) -> None:
    url = tls_registry.url(tls_registry.new_repository())
    assert main(["ls", "--json", url]) != 0
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["reason"] == "store-error"
    assert "speaks TLS" in error["detail"] and "ca_file" in error["detail"]
