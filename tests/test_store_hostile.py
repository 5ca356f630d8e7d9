"""A hostile S3 endpoint, drawn by hypothesis: status x length header x body x timing.

For every draw, ``plancache pull --fingerprint FP --timeout 1`` runs in its own process
(through ``store_probe.py --cli``, which only adds a peak-RSS reading at exit)
against it and must: end within the budget + 0.5 s (plus an explicit allowance for starting
the interpreter), peak under 256 MiB RSS, write nothing, print exactly one line on stderr,
and never contact the host a redirect points to.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import FP
from hostile_server import BODIES, LENGTHS, STATUSES, TIMINGS, Canary, Draw, HostileServer
from plancache.keys.keyfile import generate_keypair
from store_servers import AWS_ENV

SRC = str(Path(__file__).resolve().parents[1] / "src")
PROBE = str(Path(__file__).with_name("store_probe.py"))
BUDGET = 1.0
GRACE = 0.5
STARTUP = 8.0
"""Explicit allowance for the child interpreter to start and import the CLI and s3fs, on a
busy 2-core machine (measured ~1 s idle; 3 s was exceeded with the suite on 4 xdist workers beside
other load, load 7); the fetch itself is bounded by BUDGET + GRACE."""
RSS_LIMIT = 256 << 20

draws = st.builds(
    Draw,
    st.sampled_from(STATUSES),
    st.sampled_from(LENGTHS),
    st.sampled_from(sorted(BODIES)),
    st.sampled_from(TIMINGS),
)


@pytest.fixture(scope="module")
def endpoint() -> Iterator[tuple[HostileServer, Canary]]:
    canary = Canary()
    server = HostileServer(canary)
    yield server, canary
    server.stop()
    canary.stop()


@pytest.fixture(scope="module")
def pubkey(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("keys") / "k"
    generate_keypair(base, force=False, comment="k")
    return Path(f"{base}.pub")


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(draw=draws)
# the reported case: botocore read error bodies whole
@example(draw=Draw(500, "honest", "200MiB", "fast"))
# a success body that ignores the Range header
@example(draw=Draw(200, "chunked", "200MiB", "fast"))
@example(draw=Draw(307, "honest", "small", "fast"))  # a redirect to another host
@pytest.mark.parametrize(
    "read_path", [[], ["--storage-option", "config_kwargs={}"]], ids=["direct", "s3fs"]
)
def test_any_answer_is_bounded(
    read_path: list[str],
    draw: Draw,
    endpoint: tuple[HostileServer, Canary],
    pubkey: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Both read paths: plain botocore (the default for a few fingerprints) and s3fs (an
    option the botocore path does not take, ``config_kwargs``, sends the reads there)."""
    server, canary = endpoint
    server.set(draw)
    dest = tmp_path_factory.mktemp("dest")
    peak_file = dest.parent / f"{dest.name}.peak"
    argv = [
        sys.executable,
        PROBE,
        "--cli",
        str(peak_file),
        "pull",
        "--trusted-keys",
        str(pubkey),
        "--fingerprint",
        FP,
        "--timeout",
        str(BUDGET),
        "--storage-option",
        f"endpoint_url={server.endpoint}",
        *read_path,
        "s3://hostile/plans",
        str(dest),
    ]
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        env={**os.environ, **AWS_ENV, "PYTHONPATH": SRC},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    killer = threading.Timer(30, proc.kill)
    killer.start()
    assert proc.stderr is not None
    err = proc.stderr.read()
    proc.wait()
    killer.cancel()
    proc.stderr.close()
    wall = time.monotonic() - started
    rss = int(peak_file.read_text())
    _record(draw, wall, rss)
    assert wall < BUDGET + GRACE + STARTUP, (draw, wall)
    assert rss < RSS_LIMIT, (draw, rss >> 20)
    assert list(dest.iterdir()) == [], draw
    assert err.count(b"\n") == 1 and b"Traceback" not in err, (draw, err[:500])
    assert canary.connections == 0, draw


def _record(draw: Draw, wall: float, rss: int) -> None:
    """Append one measurement to $PLANCACHE_HOSTILE_LOG, if set (for BENCHMARKS.md)."""
    path = os.environ.get("PLANCACHE_HOSTILE_LOG")
    if path:
        with open(path, "a") as log:
            log.write(
                f"{draw.status} {draw.length} {draw.body} {draw.timing} {wall:.2f} {rss >> 20}\n"
            )
