"""Every store operation is bounded: in time, in memory, in threads, whatever the store does.

Real servers and files only: the fault server over HTTP, moto, real FIFOs, a black hole as
GCE metadata server. Cases that measure a process (its exit, its peak RSS) run it through
``store_probe.py`` in a subprocess, which reports its own peak RSS (``VmHWM``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from conftest import FP, plan_bytes
from plancache.storage import store as store_module
from plancache.storage.backends import CONCURRENCY
from plancache.storage.store import Store, open_store
from plancache.trust.errors import Reason
from plancache.trust.plans.plan import plan_name, sig_name
from realtime import SLACK_S
from store_servers import (
    AWS_ENV,
    BlackHole,
    FaultObject,
    FaultServer,
    black_hole,  # noqa: F401 - a fixture, named as a parameter
    closed_port,
    fault_server,  # noqa: F401 - a fixture, named as a parameter
    fault_server_session,  # noqa: F401 - a fixture, named as a parameter
    s3_read_path,  # noqa: F401 - a fixture, named as a parameter
    synthetic_fp,
)

FP2 = "fedcba9876543210"
SRC = str(Path(__file__).resolve().parents[1] / "src")
PROBE = str(Path(__file__).with_name("store_probe.py"))
MIB = 1 << 20
RSS_LIMIT = 256 * MIB


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in AWS_ENV.items():
        monkeypatch.setenv(key, value)


def probe(
    url: str,
    timeout: float,
    options: dict[str, Any] | None = None,
    fp: str = FP,
    env: dict[str, str] | None = None,
    limit: float = 30.0,
) -> dict[str, Any]:
    """Run one fetch in a child process: its report, stderr, wall time and peak RSS."""
    argv = [sys.executable, PROBE, url, fp, str(timeout)] + (
        [json.dumps(options)] if options is not None else []
    )
    child_env = {**os.environ, **AWS_ENV, "PYTHONPATH": SRC, **(env or {})}
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"the process did not exit within {limit} s") from None
    exited = time.monotonic()
    report = json.loads(out.decode().strip().splitlines()[-1])
    return {
        **report,
        "wall": exited - started,
        "exit_lag": exited - report["done_at"],
        "stderr": err.decode(),
        "code": proc.returncode,
    }


UNTIMED = 30.0
"""The budget of a read a test expects to end otherwise than by its budget (an answer, a refused
redirect): generous, since on two loaded cores s3fs's first request can take seconds (CI,
2026-12-06: a 2 s budget ran out under the vLLM fixtures, and a read that should have answered
was a timeout). Tests of a budget pass their own."""


def s3(server: FaultServer, timeout: float = UNTIMED) -> Store:
    return open_store("s3://faulty/plans", {"endpoint_url": server.endpoint}, timeout)


def serve(server: FaultServer, mode: str = "ok", fp: str = FP) -> None:
    server.state.objects[f"plans/{plan_name(fp)}"] = FaultObject(plan_bytes(fp), mode)
    server.state.objects[f"plans/{sig_name(fp)}"] = FaultObject(b"{}", mode)


# -- file:// stores: nothing blocks, nothing holds exit -----------------------------------------


def test_fifo_named_like_a_plan_is_rejected_without_blocking(tmp_path: Path) -> None:
    store_dir = tmp_path / "plans"
    store_dir.mkdir()
    os.mkfifo(store_dir / plan_name(FP))
    os.mkfifo(store_dir / sig_name(FP2))
    (store_dir / plan_name(FP2)).write_bytes(plan_bytes(FP2))
    report = probe(store_dir.as_uri(), 30.0)
    assert report["reason"] == "malformed"  # a blocking open would end at the budget: "timeout"
    assert report["stderr"].count("\n") == 1 and "not a regular file" in report["stderr"]
    store = open_store(store_dir.as_uri(), None, 1.0)
    assert store.fetch(FP2).error.reason is Reason.MALFORMED  # a FIFO sidecar too
    assert store.fingerprints() == [FP2]  # a FIFO is not listed as a plan
    store.put(FP, plan_bytes(), b"{}")  # a write replaces a planted FIFO, never opens it
    assert (store_dir / plan_name(FP)).read_bytes() == plan_bytes()


def test_a_thread_blocked_on_a_fifo_does_not_hold_exit(tmp_path: Path) -> None:
    """A sync fsspec filesystem (fsspec's own cat_file on a FIFO blocks in open): the fetch ends
    at the deadline and the process exits, the blocked thread abandoned."""
    os.mkfifo(tmp_path / plan_name(FP))
    code = (
        "import sys, time\n"
        "from fsspec.implementations.local import LocalFileSystem\n"
        "from plancache.storage.fsspec_backends import FsspecBackend\n"
        "from plancache.storage.store import Store\n"
        "b = FsspecBackend('file', fs=LocalFileSystem())\n"
        f"s = Store(b, 'file://{tmp_path}', '{tmp_path}', 1.0)\n"
        "t = time.monotonic(); r = s.fetch(sys.argv[1])\n"
        "print(r.error.reason.value, time.monotonic() - t, time.monotonic(), flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, FP],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=20,
    )
    exited = time.monotonic()
    reason, elapsed, done_at = done.stdout.split()
    assert reason == "timeout" and float(elapsed) < 1.0 + SLACK_S
    assert exited - float(done_at) < SLACK_S  # exit is not held by the thread blocked in open()


# -- S3: bodies the SDK reads are capped; no redirects ------------------------------------------


def test_s3_error_body_of_200_mib_is_capped(s3_read_path: str, fault_server: FaultServer) -> None:
    serve(fault_server, "error500-huge")
    report = probe("s3://faulty/plans", 30.0, {"endpoint_url": fault_server.endpoint})
    assert report["reason"] == "store-error"
    assert report["peak"] < RSS_LIMIT, report["peak"] / MIB
    assert report["stderr"].count("\n") == 1
    gets = [p for m, p, _ in fault_server.state.requests if p.endswith(".json")]
    assert 1 < len(gets) <= 3  # a 500 is still retried: the capped body keeps its status


def test_s3_listing_with_a_huge_error_body_or_page_is_bounded(fault_server: FaultServer) -> None:
    fault_server.state.listing_mode = "error500-huge"
    with pytest.raises(Exception) as err:
        s3(fault_server, 30.0).fingerprints()
    assert getattr(err.value, "reason", None) is Reason.STORE_ERROR
    fault_server.reset()
    fault_server.state.listing_mode = "huge-page"
    with pytest.raises(Exception) as err:
        s3(fault_server, 3.0).fingerprints()
    assert getattr(err.value, "reason", None) is Reason.TOO_LARGE
    assert fault_server.state.bytes_sent < 48 * MIB  # the 64 MiB page was cut off, never parsed


def test_s3_listing_that_never_ends_stops_at_the_page_cap(
    fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "MAX_PAGES", 20)
    fault_server.state.listing_mode = "truncated-forever"
    with pytest.raises(Exception) as err:
        s3(fault_server, 10.0).fingerprints()
    assert getattr(err.value, "reason", None) is Reason.TOO_LARGE
    assert len(fault_server.state.requests) == 20


def test_whole_store_work_streams_in_pages_and_batches(
    fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plancache.storage.s3 import reads as s3_reads

    monkeypatch.setattr(s3_reads, "PAGE_SIZE", 200)
    count = 600
    state = fault_server.state
    state.synthetic, state.synthetic_prefix, state.synthetic_body = count, "plans/", b"x"
    store = s3(fault_server, 60.0)
    finished = 0
    most_pending = 0

    def on_done(n: int) -> None:
        nonlocal finished
        finished += n

    seen = []
    for result in store.fetch_stream(store.iter_fingerprints(), on_done=on_done):
        most_pending = max(most_pending, finished - len(seen))
        seen.append(result.fingerprint)
        assert result.plan_bytes == b"x" and result.error is None
    assert seen == [synthetic_fp(i) for i in range(count)]
    assert most_pending <= CONCURRENCY  # one batch of results in memory, never the store
    listings = [p for m, p, _ in state.requests if "list-type=2" in p]
    assert len(listings) == 6  # 1200 keys, 200 per page, each page asked for when needed


def test_redirect_to_another_host_is_not_followed(
    s3_read_path: str, fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = FaultServer()
    try:
        serve(other)
        fault_server.state.redirect_to = other.endpoint
        result = s3(fault_server).fetch(FP)
        assert result.error is not None and result.error.reason is Reason.STORE_ERROR
        assert "not followed" in result.error.detail
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", fault_server.endpoint)
        result = open_store("gs://faulty/plans", {"token": "anon"}, UNTIMED).fetch(FP)
        assert result.error is not None and "not followed" in result.error.detail
        assert other.state.requests == []
    finally:
        other.stop()


def test_gcs_takes_no_3xx_for_an_object(
    fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 3xx without a Location is left to botocore on S3 (its region redirector reads it); on
    GCS it is refused: gcsfs would otherwise hand the 3xx's body on as the object's bytes."""
    serve(fault_server)
    fault_server.state.bucket_region = "eu-west-1"  # every unsigned GET: 301, no Location
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fault_server.endpoint)
    result = open_store("gs://faulty/plans", {"token": "anon"}, UNTIMED).fetch(FP)
    assert result.error is not None and result.error.reason is Reason.STORE_ERROR, result
    assert "301" in result.error.detail and result.plan_bytes is None


@pytest.mark.parametrize("kind", ["s3", "gcs"])
def test_a_range_over_an_empty_object_reads_as_empty(
    kind: str, fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3 and GCS answer 416 to a range over an empty object; a read from byte 0 cannot be
    unsatisfiable for another reason. An empty sidecar is then ``malformed`` to the verifier,
    never a store error (which ``prune --invalid`` would skip and ``pull`` would exit 2 on)."""
    # GCS's media path, as the server parses it
    prefix = "plans" if kind == "s3" else "storage/v1/b/faulty/o/plans"
    fault_server.state.objects[f"{prefix}/{plan_name(FP)}"] = FaultObject(plan_bytes(FP))
    fault_server.state.objects[f"{prefix}/{sig_name(FP)}"] = FaultObject(b"", "range416")
    if kind == "s3":
        store = s3(fault_server)
    else:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", fault_server.endpoint)
        store = open_store("gs://faulty/plans", {"token": "anon"}, UNTIMED)
    result = store.fetch(FP)
    assert (
        result.error is None and result.plan_bytes == plan_bytes(FP) and result.sig_bytes == b""
    ), result


# -- deadlines: SDK calls and credential discovery inside; one right reason -------------------


def test_gcs_credential_discovery_runs_inside_the_deadline(
    black_hole: BlackHole, tmp_path: Path
) -> None:
    """No token option: google-auth looks for the GCE metadata server, here a black hole."""
    host = f"127.0.0.1:{black_hole.port}"
    env = {
        "GCE_METADATA_HOST": host,
        "GCE_METADATA_IP": host,
        "HOME": str(tmp_path),
        "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
        "GOOGLE_APPLICATION_CREDENTIALS": "",
        "STORAGE_EMULATOR_HOST": "",
    }
    report = probe(
        "gs://bucket/plans", 1.0, {"endpoint_url": f"http://127.0.0.1:{closed_port()}"}, env=env
    )
    assert report["reason"] == "timeout" and report["elapsed"] < 1.0 + SLACK_S
    assert report["exit_lag"] < SLACK_S  # the discovery thread, still on the hole, holds no exit
    assert report["stderr"].count("\n") == 1


@pytest.mark.parametrize("kind", ["s3", "gcs"])
def test_black_hole_is_a_timeout_and_refused_a_store_error(
    kind: str, black_hole: BlackHole, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One right reason each, in real time: the black hole by its budget; the refused one long
    before its roomy budget (a slow first client setup on a loaded machine cannot turn it into a
    timeout), since it is never retried (on fake time: tests/test_deadlines.py)."""
    for endpoint, budget, expected in (
        (black_hole.endpoint, 1.0, Reason.TIMEOUT),
        (f"http://127.0.0.1:{closed_port()}", 30.0, Reason.STORE_ERROR),
    ):
        if kind == "s3":
            store = open_store("s3://b/plans", {"endpoint_url": endpoint}, budget)
        else:
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
            store = open_store("gs://b/plans", {"token": "anon"}, budget)
        started = time.monotonic()
        result = store.fetch(FP)
        assert result.error is not None and result.error.reason is expected, result.error
        assert time.monotonic() - started < (budget if expected is Reason.TIMEOUT else 0) + SLACK_S


def test_deadline_keeps_what_was_fetched(s3_read_path: str, fault_server: FaultServer) -> None:
    """The budget is roomy (5 s, against a trickle of ~20 s) because it also holds the client's
    first setup, which a loaded CI machine once stretched past 1.5 s before the fast plan came."""
    serve(fault_server)
    serve(fault_server, "trickle", FP2)
    fast, slow = s3(fault_server, 5.0).fetch_many([FP, FP2])
    assert fast.error is None and fast.plan_bytes == plan_bytes(FP)
    assert slow.error is not None and slow.error.reason is Reason.TIMEOUT


@pytest.mark.parametrize("url", ["s3://faulty/plans", "gs://faulty/plans", "az://faulty/plans"])
def test_the_deeper_prefix_walk_of_a_hostile_listing_holds_a_page_not_the_listing(
    url: str, fault_server: FaultServer, tmp_path: Path
) -> None:
    """``verify`` of a prefix with no plans names the prefixes below it that hold some. Below
    this one, a listing that never ends: 3.5 MiB pages of keys, each saying there is another
    (S3's ListObjectsV2, GCS's JSON API and Azure's List Blobs from the fault server). The walk used
    the SDK's ``ls``, which gathers every page before returning (289 MiB after 10 s through s3fs,
    growing); it now asks for one page at a time, keeps none of it, and stops at MAX_LISTINGS
    requests (the near-miss walk from its parent looks only one level down, at the siblings)."""
    from plancache.keys.keyfile import generate_keypair
    from plancache.storage.checks import MAX_LISTINGS

    fault_server.state.hostile_prefix = "plans/deep/"
    generate_keypair(tmp_path / "k", force=False, comment="k")
    peak_file = tmp_path / "peak"
    option = f"endpoint_url={fault_server.endpoint}" if url.startswith("s3") else "token=anon"
    argv = [
        sys.executable,
        PROBE,
        "--cli",
        str(peak_file),
        "verify",
        "--trusted-keys",
        str(tmp_path / "k.pub"),
        "--timeout",
        "10",
        "--storage-option",
        option,
        url,
    ]
    env = {
        **os.environ,
        **AWS_ENV,
        "PYTHONPATH": SRC,
        "STORAGE_EMULATOR_HOST": fault_server.endpoint,
        "AZURE_STORAGE_CONNECTION_STRING": (
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey="
            "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
            f"BlobEndpoint={fault_server.endpoint}/devstoreaccount1;"
        ),
    }
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and f"no plans in {url}" in result.stderr, result.stderr
    hostile = [
        p
        for m, p, _ in fault_server.state.requests
        if m == "GET" and "prefix=plans/deep/&" in unquote(p)
    ]
    assert 0 < len(hostile) <= MAX_LISTINGS, len(hostile)
    assert int(peak_file.read_text()) < 160 * MIB, int(peak_file.read_text()) >> 20


@pytest.mark.parametrize("url", ["s3://faulty/plans", "gs://faulty/plans", "az://faulty/plans"])
def test_a_compile_cache_folder_listing_that_never_ends_stops_at_its_cap(
    url: str, fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compile-cache pull`` lists the store's compile-cache folder to find its caches. The
    folder's listing went through the SDK's ``ls``, which gathers every page into one list before
    returning: under a listing that never ends (3.5 MiB pages, each saying there is another) it
    grew by every page the server sent until the deadline (+321 MiB in 8 s through s3fs, 67
    pages; main too). It now keeps the entries page by page and stops past
    MAX_FOLDER_ENTRIES, a few pages in, with ``too-large``: not at the deadline."""
    from plancache.storage.compile_cache import archives
    from plancache.storage.listing import MAX_FOLDER_ENTRIES
    from plancache.trust.errors import Rejected

    fault_server.state.hostile_prefix = f"plans/{archives.PREFIX}/"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fault_server.endpoint)
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING",
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey="
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
        f"BlobEndpoint={fault_server.endpoint}/devstoreaccount1;",
    )
    options = {"endpoint_url": fault_server.endpoint} if url.startswith("s3") else {}
    if url.startswith("gs"):
        options = {"token": "anon"}
    store = open_store(url, options, 60.0)
    with pytest.raises(Rejected) as caught:
        archives.list_subjects(store)
    assert caught.value.reason is Reason.TOO_LARGE, caught.value
    hostile = [
        p
        for m, p, _ in fault_server.state.requests
        if m == "GET" and f"{archives.PREFIX}/" in unquote(p)
    ]
    pages = MAX_FOLDER_ENTRIES // 3500 + 1  # the fault server's 3,500 keys a page
    assert 0 < len(hostile) <= pages, len(hostile)


def test_an_http_store_reads_at_most_its_cap_and_never_inflates(fault_server: FaultServer) -> None:
    """A store on a plain web server (``https://``: "any other fsspec protocol") is read through
    fsspec's HTTPFileSystem, which reads a body whole whatever range it asked for, and lets
    aiohttp inflate gzip. A plan answered with 1 GiB that ignores the Range header made one
    fetch peak at 2.1 GiB before the cap refused it (main too); a small gzip body declared
    ``Content-Encoding: gzip`` was inflated before any cap saw it. Its session is now capped
    like gcsfs's (:mod:`plancache.storage.caps.http`): the read stops at the cap, the
    connection is dropped, and a body is handed over as sent (the trust core rejects it)."""
    import gzip

    bomb = gzip.compress(b"\0" * (8 << 20))  # 8 KiB that inflate to 8 MiB
    fault_server.state.objects[f"plans/{plan_name(FP)}"] = FaultObject(b"", "huge")
    fault_server.state.objects[f"plans/{sig_name(FP)}"] = FaultObject(b"{}")
    fault_server.state.objects[f"plans/{plan_name(FP2)}"] = FaultObject(bomb, "gzip")
    fault_server.state.objects[f"plans/{sig_name(FP2)}"] = FaultObject(b"{}")
    store = open_store(f"{fault_server.endpoint}/faulty/plans", None, 30.0)
    huge, zipped = store.fetch_many([FP, FP2])
    assert huge.error is not None and huge.error.reason is Reason.TOO_LARGE, huge
    time.sleep(0.2)  # what the server could still write into the socket's buffers
    assert fault_server.state.bytes_sent < 64 * MIB  # a socket buffer's worth, never the 1 GiB
    assert zipped.error is None and zipped.plan_bytes == bomb and zipped.sig_bytes == b"{}"


def test_a_local_compile_cache_folder_is_listed_up_to_its_cap(tmp_path: Path) -> None:
    """The same folder listing on ``file://``: fsspec's ``ls`` stat'ed every entry into one
    list (300,000 names planted by whoever may write the store's directory: 320 MiB, main
    too); the folder is now scanned an entry at a time and refused past MAX_FOLDER_ENTRIES."""
    from plancache.storage.compile_cache import archives
    from plancache.storage.listing import MAX_FOLDER_ENTRIES
    from plancache.trust.errors import Rejected

    folder = tmp_path / archives.PREFIX
    folder.mkdir()
    store = open_store(tmp_path.as_uri(), None, 30.0)
    (folder / "torch_aot_compile").mkdir()
    assert archives.list_subjects(store) == []  # a few entries: listed as before
    for i in range(MAX_FOLDER_ENTRIES + 1):
        (folder / f"planted-{i}").touch()
    with pytest.raises(Rejected) as caught:
        archives.list_subjects(store)
    assert caught.value.reason is Reason.TOO_LARGE, caught.value
