"""A store fetch in its own process, so that its exit, peak RSS and stderr can be measured.

``python store_probe.py URL FP TIMEOUT [OPTIONS_JSON]``: one ``Store.fetch`` as
``plancache pull --fingerprint`` does it; prints one JSON line on stdout (reason, seconds
inside the fetch, peak RSS in bytes) and, on failure, one line on stderr.

``python store_probe.py --cli PEAK_FILE ARGS...``: ``plancache ARGS...`` itself, unchanged,
writing its peak RSS to PEAK_FILE as it exits.

Peak RSS is the kernel's ``VmHWM``, which ``exec`` resets: ``ru_maxrss`` of a child would
also count the pages of the forked test process it started as.
"""

from __future__ import annotations

import json
import sys
import time


def peak_rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def fetch() -> int:
    url, fp, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
    import os

    from plancache.storage import store
    from plancache.storage.backends import _filesystem_class
    from plancache.storage.store import open_store

    if os.environ.get("PLANCACHE_TEST_S3_PATH") == "s3fs":  # tests' s3_read_path fixture
        store.MAX_FINGERPRINTS = 0
    _filesystem_class(url.split("://", 1)[0], url)  # SDK imports are start-up, not the fetch
    started = time.monotonic()
    result = open_store(url, options, timeout).fetch(fp)
    elapsed = time.monotonic() - started
    reason = (
        result.error.reason.value
        if result.error
        else ("missing" if result.plan_bytes is None else "ok")
    )
    report = {"reason": reason, "elapsed": elapsed, "peak": peak_rss(), "done_at": time.monotonic()}
    print(json.dumps(report), flush=True)  # done_at: CLOCK_MONOTONIC is one clock for all processes
    if result.error:
        print(f"plancache: {reason}: {result.error.detail}", file=sys.stderr)
        return 2
    return 0


def cli() -> int:
    from plancache.cli.main import main

    try:
        return main(sys.argv[3:])
    finally:
        with open(sys.argv[2], "w") as out:
            out.write(str(peak_rss()))


if __name__ == "__main__":
    sys.exit(cli() if sys.argv[1] == "--cli" else fetch())
