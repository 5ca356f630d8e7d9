"""The boot path on ``s3://``: a few fingerprints read through plain botocore, no s3fs.

The hostile cases (caps, redirects, deadlines, retries) run on both read paths in
test_store_faults.py and test_store_bounds.py (the ``s3_read_path`` fixture); here, what is
particular to this path: when it is taken and when s3fs is, what it imports, and that it
reads, signs and fails exactly as the s3fs path does. Real servers only: moto over HTTP and
the fault server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FP, plan_bytes
from plancache.storage.s3.direct import MAX_FINGERPRINTS, direct_settings
from plancache.storage.store import open_store
from plancache.trust.errors import Reason
from plancache.trust.plans.plan import plan_name, sig_name
from store_servers import (
    AWS_ENV,
    FaultObject,
    FaultServer,
    MotoServer,
    fault_server,  # noqa: F401 - a fixture, named as a parameter
    fault_server_session,  # noqa: F401 - a fixture, named as a parameter
    s3_read_path,  # noqa: F401 - a fixture, named as a parameter
)

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in AWS_ENV.items():
        monkeypatch.setenv(key, value)


@pytest.fixture(scope="module")
def moto() -> object:
    server = MotoServer()
    yield server
    server.stop()


def fps(n: int) -> list[str]:
    return [f"{i:016x}" for i in range(n)]


def serve(server: FaultServer, fingerprints: list[str]) -> None:
    for fp in fingerprints:
        server.state.objects[f"plans/{plan_name(fp)}"] = FaultObject(plan_bytes(fp))
        server.state.objects[f"plans/{sig_name(fp)}"] = FaultObject(b"{}")


def test_which_options_take_the_direct_path(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    settings = direct_settings(
        "s3://bucket/a/b/",
        {
            "endpoint_url": "http://h:1",
            "key": "K",
            "secret": "S",
            "client_kwargs": {"region_name": "eu-west-1"},
        },
        env,
    )
    assert settings is not None and settings.root == "bucket/a/b" and settings.key("x") == "a/b/x"
    assert settings.client_kwargs == {
        "endpoint_url": "http://h:1",
        "aws_access_key_id": "K",
        "aws_secret_access_key": "S",
        "region_name": "eu-west-1",
    }
    anonymous = direct_settings("s3a://bucket", {"anon": True}, env)
    assert anonymous is not None and anonymous.anon
    for url, options, extra_env in (
        # s3fs passes it to botocore's Config
        ("s3://bucket/p", {"config_kwargs": {"signature_version": "s3"}}, {}),
        ("s3://bucket/p", {"requester_pays": True}, {}),
        ("s3://bucket/p", {"client_kwargs": {"aws_session_token": "t"}}, {}),
        ("s3://bucket/p", {"anon": "yes"}, {}),  # s3fs would read it as true; not guessed here
        ("s3://bucket/p?versionId=1", {}, {}),
        ("s3:///bucket/p", {}, {}),
        ("s3://", {}, {}),
        ("gs://bucket/p", {}, {}),
        ("s3://bucket/p", {}, {"FSSPEC_S3_ENDPOINT_URL": "http://elsewhere"}),
    ):
        assert direct_settings(url, options, {**env, **extra_env}) is None, (
            url,
            options,
            extra_env,
        )
    (tmp_path / ".config" / "fsspec").mkdir(parents=True)
    # an empty config directory configures nothing
    assert direct_settings("s3://bucket/p", {}, env) is not None
    (tmp_path / ".config" / "fsspec" / "conf.json").write_text('{"s3": {"anon": true}}')
    assert direct_settings("s3://bucket/p", {}, env) is None


def test_a_boot_pull_imports_no_s3fs_and_a_bulk_one_uses_it(
    fault_server: FaultServer, tmp_path: Path
) -> None:
    """The point of the path: a boot-time pull does not pay for aiobotocore and aiohttp, nor
    for asyncio (10-20 ms of a boot-time ``pull``: botocore runs no event loop)."""
    serve(fault_server, fps(MAX_FINGERPRINTS + 1))
    code = (
        "import sys; from plancache.storage.store import open_store; "
        "s = open_store('s3://faulty/plans', {'endpoint_url': sys.argv[1]}, 10.0); "
        "r = s.fetch_many(sys.argv[2:]); "
        "assert all(x.plan_bytes and x.error is None for x in r), r; "
        "print(' '.join(sorted(m for m in ('s3fs', 'aiobotocore', 'aiohttp', 'fsspec', "
        "'asyncio') if m in sys.modules)))"
    )
    env = {**os.environ, **AWS_ENV, "PYTHONPATH": SRC}
    few = subprocess.run(
        [sys.executable, "-c", code, fault_server.endpoint, *fps(MAX_FINGERPRINTS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert few.returncode == 0 and few.stdout.split() == [], few.stderr
    many = subprocess.run(
        [sys.executable, "-c", code, fault_server.endpoint, *fps(MAX_FINGERPRINTS + 1)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert many.returncode == 0 and many.stdout.split() == [
        "aiobotocore",
        "aiohttp",
        "asyncio",
        "fsspec",
        "s3fs",
    ], many.stderr


def test_once_s3fs_is_built_every_read_goes_through_it(fault_server: FaultServer) -> None:
    serve(fault_server, fps(2))
    store = open_store("s3://faulty/plans", {"endpoint_url": fault_server.endpoint}, 10.0)
    assert store.fetch(fps(1)[0]).plan_bytes and not store._backend.opened
    assert store.fingerprints() == fps(2) and store._backend.opened  # the listing needs s3fs
    requests = len(fault_server.state.requests)
    assert store.fetch(fps(1)[0]).plan_bytes == plan_bytes(fps(1)[0])
    assert len(fault_server.state.requests) == requests + 2


def test_same_bytes_and_same_misses_as_s3fs(moto: MotoServer) -> None:
    """Against moto: a plan, an empty sidecar (S3 answers 416 to its range), a missing plan,
    a missing bucket: each path says the same."""
    bucket = moto.new_bucket()
    url = f"s3://{bucket}/plans"
    writer = open_store(url, moto.options, 10.0)
    writer.put_many({plan_name(FP): plan_bytes(), sig_name(FP): b""})
    outcomes = []
    for direct in (True, False):
        store = open_store(url, moto.options, 10.0)
        if not direct:
            store.open_backend()  # built: reads go through s3fs
        got, missing = store.fetch_many([FP, "0" * 16])
        gone = open_store(f"s3://{bucket}-nope/plans", moto.options, 10.0)
        if not direct:
            gone.open_backend()
        outcomes.append(
            (
                got.plan_bytes,
                got.sig_bytes,
                got.error,
                missing.plan_bytes,
                missing.error,
                gone.fetch(FP).plan_bytes,
                not store._backend.opened,
            )
        )
    assert outcomes[0][:-1] == outcomes[1][:-1] == (plan_bytes(), b"", None, None, None, None)
    assert [o[-1] for o in outcomes] == [True, False]


def test_requests_are_signed_unless_anonymous(fault_server: FaultServer) -> None:
    serve(fault_server, fps(1))
    assert (
        open_store("s3://faulty/plans", {"endpoint_url": fault_server.endpoint}, 5.0)
        .fetch(fps(1)[0])
        .plan_bytes
    )
    assert fault_server.state.signed == [True, True]
    fault_server.state.signed.clear()
    store = open_store(
        "s3://faulty/plans", {"endpoint_url": fault_server.endpoint, "anon": True}, 5.0
    )
    assert store.fetch(fps(1)[0]).plan_bytes and fault_server.state.signed == [False, False]


def test_configuration_mistakes_are_one_config_line(fault_server: FaultServer) -> None:
    for options, url, words in (
        ({"profile": "no-such-profile"}, "s3://faulty/plans", "no-such-profile"),
        ({}, "s3://Bad_Bucket!/plans", "Bad_Bucket!"),
    ):
        result = open_store(url, {"endpoint_url": fault_server.endpoint, **options}, 5.0).fetch(FP)
        assert result.error is not None and result.error.reason is Reason.CONFIG, result.error
        assert words in result.error.detail and "\n" not in result.error.detail
    assert fault_server.state.requests == []  # neither got as far as the network


def test_a_body_botocore_would_read_whole_is_capped(fault_server: FaultServer) -> None:
    """Only ranged GETs go through the direct client, whose bodies the caller caps; any other
    call on it (here a listing page of 64 MiB) is capped by the before-send hook too."""
    from plancache.trust.errors import Rejected

    fault_server.state.listing_mode = "huge-page"
    store = open_store("s3://faulty/plans", {"endpoint_url": fault_server.endpoint}, 10.0)
    with pytest.raises(Rejected) as err:
        store._backend.direct.client().list_objects_v2(Bucket="faulty", Prefix="plans/")
    assert err.value.reason is Reason.TOO_LARGE
    assert fault_server.state.bytes_sent < 48 << 20


@pytest.mark.parametrize(
    "options", [[], ["--storage-option", "config_kwargs={}"]], ids=["direct", "s3fs"]
)
def test_without_the_s3_extra_a_pull_says_which_extra(options: list[str], tmp_path: Path) -> None:
    """A core-only install (no botocore, no s3fs): one configuration line naming the extra, exit
    2."""
    code = (
        "import sys\n"
        "for name in ('botocore', 'boto3', 's3fs', 'aiobotocore'): sys.modules[name] = None\n"
        "from plancache.cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    keys = tmp_path / "k.pub"
    keys.write_text(
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOlT8T8lZ0r7Q3t1v6sJ6W7mR3W1r0Yc0b3b1n7y2mXz k\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "pull",
            "--trusted-keys",
            str(keys),
            "--fingerprint",
            FP,
            *options,
            "s3://bucket/plans",
            str(tmp_path / "d"),
        ],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert (
        "pip install 'plancache[s3]'" in done.stdout + done.stderr
        and "Traceback" not in done.stderr
    )


def test_a_bucket_in_another_region_is_read_as_s3fs_reads_it(
    s3_read_path: str, fault_server: FaultServer
) -> None:
    """S3 answers a request signed for the wrong region with 301 PermanentRedirect and the
    bucket's region in a header, no Location: botocore re-signs for that region (its own
    redirector, never a Location followed). Nodes whose default region is not the bucket's
    must still boot from the store on either path."""
    serve(fault_server, fps(1))
    fault_server.state.bucket_region = "eu-west-1"
    result = open_store("s3://faulty/plans", {"endpoint_url": fault_server.endpoint}, 5.0).fetch(
        fps(1)[0]
    )
    assert result.error is None and result.plan_bytes == plan_bytes(fps(1)[0]), result.error
