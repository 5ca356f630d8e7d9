"""Azure Blob stores that fail or attack, and how an Azure store is opened.

Real sockets on 127.0.0.1 only: Azurite for the round trips, the fault server answering
Azure-shaped reads (``/<account>/<container>/<key>``) for 500s, truncated and huge bodies and
redirects, a black hole, a closed port. Budgets are asserted with a generous upper bound.
"""

from __future__ import annotations

import functools
import time
import warnings
from pathlib import Path

import pytest

import store_servers
from azurite_server import azure_connection_string
from conftest import FP, plan_bytes, raw
from fake_clock import FakeClock
from plancache.cli.main import main
from plancache.clock import Deadline
from plancache.keys.keyfile import generate_keypair
from plancache.storage.azure.blob import BoundedAzureBlobFileSystem, CappedTransport
from plancache.storage.local.localdir import LocalPlanDir
from plancache.storage.store import Store, open_store
from plancache.trust.envelope import MAX_SIG_OBJECT_BYTES
from plancache.trust.errors import PlanCacheError, Reason
from plancache.trust.plans.plan import MAX_PLAN_BYTES, plan_name
from realtime import SLACK_S
from store_servers import (
    BlackHole,
    FaultServer,
    azurite,  # noqa: F401 - a fixture, named as a parameter
    black_hole,  # noqa: F401 - a fixture, named as a parameter
    closed_port,
    fault_server,  # noqa: F401 - a fixture, named as a parameter
    fault_server_session,  # noqa: F401 - a fixture, named as a parameter
    nothing_written,
    pull_fingerprint,
)

CONTAINER = "faulty"
PREFIX = "plans"
URL = f"az://{CONTAINER}/{PREFIX}"


def az_store(endpoint: str, timeout: float = 2.0, clock: FakeClock | None = None) -> Store:
    """Azurite's account at ``endpoint``; on ``clock``, the store's budgets are measured and
    paused on it."""
    due = None if clock is None else Deadline.after(timeout, clock)
    options = {"connection_string": azure_connection_string(endpoint)}
    return open_store(URL, options, timeout, deadline=due)


def key(name: str) -> str:
    """Where the fault server keeps an object: the account is the 'bucket', the rest the key."""
    return f"{CONTAINER}/{PREFIX}/{name}"


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    generate_keypair(tmp_path / "ci", force=False, comment="ci")
    return tmp_path / "ci"


serve_signed = functools.partial(store_servers.serve_signed, prefix=f"{CONTAINER}/{PREFIX}")


ROOMY = ("--timeout", "30")
"""For the pulls that check what was read, not when: room for a loaded CI machine (the 3 s default
timed out there while the SDK client was still being built)."""


def pull(
    capsys: pytest.CaptureFixture[str], endpoint: str, keys: Path, dest: Path, *extra: str
) -> tuple[int, str, str, float]:
    return pull_fingerprint(
        capsys, URL, f"connection_string={azure_connection_string(endpoint)}", keys, dest, *extra
    )


# -- faults -----------------------------------------------------------------------------------


def test_one_fetch_is_two_ranged_gets(
    fault_server: FaultServer, keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    serve_signed(fault_server, keys)
    code, _, err, _ = pull(capsys, fault_server.endpoint, keys, tmp_path / "d", *ROOMY)
    assert code == 0, err
    requests = [(m, r) for m, _, r in fault_server.state.requests]
    # the plan's cap and the sidecar's (64 KiB and each keyless signature's allowance), in
    # either order: the two reads run side by side, and a loaded machine answers either first
    assert sorted(requests) == sorted(
        [("GET", f"bytes=0-{MAX_PLAN_BYTES}"), ("GET", f"bytes=0-{MAX_SIG_OBJECT_BYTES}")]
    )
    assert (tmp_path / "d" / plan_name(FP)).read_bytes() == plan_bytes()


def test_connection_refused_fails_fast(
    keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    for operation in (
        lambda s: raw(s.fetch(FP)),
        lambda s: s.fingerprints(),
        lambda s: s.put(FP, b"{}", None),
    ):
        clock = FakeClock()
        with pytest.raises(PlanCacheError) as err:
            operation(az_store(endpoint, timeout=30.0, clock=clock))
        assert clock.slept == []  # no retries, no backoff: nobody is listening
        assert err.value.reason is Reason.STORE_ERROR and "connection refused" in err.value.detail
    code, _out, err_text, _ = pull(capsys, endpoint, keys, tmp_path / "d")
    assert code == 2 and err_text.count("\n") == 1 and "Traceback" not in err_text
    assert nothing_written(tmp_path / "d")


def test_black_hole_ends_at_the_budget(
    black_hole: BlackHole, keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for operation in (
        lambda s: raw(s.fetch(FP)),
        lambda s: s.fingerprints(),
        lambda s: s.put(FP, b"{}", None),
    ):
        started = time.monotonic()
        with pytest.raises(PlanCacheError) as err:
            operation(az_store(black_hole.endpoint, timeout=1.0))
        assert err.value.reason is Reason.TIMEOUT and time.monotonic() - started < 1.0 + SLACK_S
    # the 3 s default
    code, out, _, elapsed = pull(capsys, black_hole.endpoint, keys, tmp_path / "d")
    assert code == 2 and elapsed < 3.0 + SLACK_S and "timeout" in out
    assert nothing_written(tmp_path / "d")


def test_http_500_forever_is_a_store_error_after_plancaches_retries_only(
    fault_server: FaultServer, keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    serve_signed(fault_server, keys, mode="error500")
    code, out, _, _ = pull(capsys, fault_server.endpoint, keys, tmp_path / "d", *ROOMY)
    assert code == 2 and "store-error" in out
    plan_gets = [p for m, p, _ in fault_server.state.requests if p.endswith(".json")]
    assert 1 < len(plan_gets) <= 3  # plancache's retries, and none of the SDK's
    assert nothing_written(tmp_path / "d")


def test_one_http_500_is_retried(
    fault_server: FaultServer, keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    serve_signed(fault_server, keys, mode="error500-once")
    code, _, err, _ = pull(capsys, fault_server.endpoint, keys, tmp_path / "d", *ROOMY)
    assert code == 0, err
    assert (tmp_path / "d" / plan_name(FP)).exists()


def test_truncated_body_is_a_store_error(
    fault_server: FaultServer, keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    serve_signed(fault_server, keys, sig_mode="truncate")
    code, out, _, _ = pull(capsys, fault_server.endpoint, keys, tmp_path / "d", *ROOMY)
    assert code == 2 and "store-error" in out
    assert nothing_written(tmp_path / "d")


def test_huge_body_that_ignores_the_range_is_not_downloaded(
    fault_server: FaultServer, keys: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    serve_signed(fault_server, keys, mode="huge")
    code, out, _, _ = pull(capsys, fault_server.endpoint, keys, tmp_path / "d", *ROOMY)
    assert code == 1 and "too-large" in out
    time.sleep(0.2)
    assert fault_server.state.bytes_sent < 64 * 2**20  # a socket buffer's worth, never the 1 GiB
    assert nothing_written(tmp_path / "d")


def test_huge_error_body_is_capped(fault_server: FaultServer, keys: Path) -> None:
    serve_signed(fault_server, keys, mode="error500-huge")  # a 500 streaming 200 MiB
    with pytest.raises(PlanCacheError) as err:
        raw(az_store(fault_server.endpoint, timeout=30.0).fetch(FP))
    assert err.value.reason is Reason.STORE_ERROR
    time.sleep(0.2)
    assert fault_server.state.bytes_sent < 64 * 2**20


def test_redirect_to_another_host_is_not_followed(fault_server: FaultServer, keys: Path) -> None:
    other = FaultServer()
    try:
        serve_signed(other, keys)
        fault_server.state.redirect_to = other.endpoint
        with pytest.raises(PlanCacheError) as err:
            raw(az_store(fault_server.endpoint).fetch(FP))
        assert err.value.reason is Reason.STORE_ERROR and "not followed" in err.value.detail
        assert other.state.requests == []  # not one byte went to the other host
        # one per object: a refused redirect is not retried
        assert len(fault_server.state.requests) == 2
    finally:
        other.stop()


# -- how an Azure store is opened -------------------------------------------------------------


def test_budget_defaults_and_their_overrides() -> None:
    options = {"connection_string": azure_connection_string("http://127.0.0.1:1")}
    fs = open_store(URL, options, 3.0).open_backend().fs
    assert type(fs) is BoundedAzureBlobFileSystem
    transport = fs.service_client._pipeline._transport
    assert isinstance(transport, CappedTransport)
    assert (transport.connection_config.timeout, transport.connection_config.read_timeout) == (
        1.0,
        1.5,
    )
    assert fs.service_client._config.retry_policy.total_retries == 0
    fs = open_store(URL, {**options, "read_timeout": 9, "retry_total": 2}, 3.0).open_backend().fs
    assert fs.service_client._pipeline._transport.connection_config.read_timeout == 9
    assert fs.service_client._config.retry_policy.total_retries == 2


@pytest.mark.parametrize(
    "url",
    ["abfs://plans/fleet", "az://plans/fleet", "abfss://plans@acct.dfs.core.windows.net/fleet"],
)
def test_url_forms_and_credentials_as_adlfs_reads_them(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (
        "AZURE_STORAGE_CONNECTION_STRING",
        "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_SAS_TOKEN",
        "AZURE_STORAGE_CLIENT_ID",
        "AZURE_STORAGE_ANON",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acct")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # adlfs warns about its sync credentials: none is made
        store = open_store(url, {"anon": False}, 3.0)
        fs = store.open_backend().fs
    assert store.scheme == "azure" and store.root.split("/") == ["plans", "fleet"]
    from azure.identity.aio import DefaultAzureCredential

    assert isinstance(fs.credential, DefaultAzureCredential) and fs.sync_credential is None
    assert fs.service_client.url.startswith("https://acct.blob.core.windows.net")
    key_fs = open_store(url, {"account_name": "acct", "account_key": "a2V5"}, 3.0).open_backend().fs
    assert key_fs.service_client.credential.account_name == "acct"
    sas_fs = (
        open_store(url, {"account_name": "acct", "sas_token": "sv=2026&sig=x"}, 3.0)
        .open_backend()
        .fs
    )
    assert "sig=x" in sas_fs.service_client.url and sas_fs.service_client.credential is None


def test_missing_credentials_are_one_config_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME"):
        monkeypatch.delenv(name, raising=False)
    generate_keypair(tmp_path / "k", force=False, comment="k")
    code = main(
        ["pull", "--trusted-keys", str(tmp_path / "k.pub"), "az://plans/fleet", str(tmp_path / "d")]
    )
    _, err = capsys.readouterr()
    assert (
        code == 2
        and err.startswith("plancache: error:")
        and err.count("\n") == 1
        and "account" in err
    )


def test_cli_round_trip_with_the_connection_string_from_the_environment(
    azurite, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    url = f"abfs://{azurite.new_container()}/fleet"
    generate_keypair(tmp_path / "ci", force=False, comment="ci")
    LocalPlanDir(tmp_path / "ci-plans").write(FP, plan_bytes(), None)
    assert main(["push", "--key", str(tmp_path / "ci"), str(tmp_path / "ci-plans"), url]) == 0
    assert main(["verify", "--trusted-keys", str(tmp_path / "ci.pub"), url]) == 0
    code = main(
        [
            "pull",
            "--trusted-keys",
            str(tmp_path / "ci.pub"),
            "--fingerprint",
            FP,
            url,
            str(tmp_path / "spot"),
        ]
    )
    assert code == 0, capsys.readouterr()
    capsys.readouterr()
    assert (tmp_path / "spot" / plan_name(FP)).read_bytes() == plan_bytes()


# -- a process that fetched from a bad store: bounded memory, prompt exit ------------------------


def test_a_process_exits_promptly_and_stays_small_whatever_the_store_did(
    black_hole: BlackHole, fault_server: FaultServer, keys: Path
) -> None:
    from test_store_bounds import RSS_LIMIT, probe

    options = {"connection_string": azure_connection_string(black_hole.endpoint)}
    report = probe(URL, 1.0, options)
    assert report["reason"] == "timeout" and report["elapsed"] < 1.0 + SLACK_S
    assert report["exit_lag"] < SLACK_S  # adlfs's closing its client does not wait on the hole
    serve_signed(fault_server, keys, mode="huge")
    report = probe(URL, 3.0, {"connection_string": azure_connection_string(fault_server.endpoint)})
    assert report["reason"] == "too-large" and report["peak"] < RSS_LIMIT
