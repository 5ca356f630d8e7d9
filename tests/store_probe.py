"""A single-fingerprint fetch as ``plancache pull --fingerprint`` does it, in its own process.

Run by the store tests as ``python store_probe.py URL FP TIMEOUT [OPTIONS_JSON]`` so that the
process's exit, its peak RSS and its stderr can be measured; stands in for the CLI while it
is rewritten. Prints one JSON line on stdout (reason, seconds inside the fetch, peak RSS in
bytes) and, on failure, one line on stderr.
"""

from __future__ import annotations

import json
import resource
import sys
import time


def main() -> int:
    url, fp, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
    from plancache.storage.store import open_store
    from plancache.storage.backends import _filesystem_class

    _filesystem_class(url.split("://", 1)[0], url)  # SDK imports are start-up, not the fetch

    started = time.monotonic()
    result = open_store(url, options, timeout).fetch(fp)
    elapsed = time.monotonic() - started
    reason = result.error.reason.value if result.error else ("missing" if result.plan_bytes is None else "ok")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"reason": reason, "elapsed": elapsed, "peak": peak}))
    if result.error:
        print(f"plancache: {reason}: {result.error.detail}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
