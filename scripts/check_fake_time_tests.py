#!/usr/bin/env python3
"""Do the fake-time tests catch a broken budget? Break one piece of the logic at a time, in a copy
of ``src/``, and run tests/test_deadlines.py and tests/test_budget_paths.py against it: each
mutation must make them fail (docs/test-suite.md, "Budgets on fake time").

    python scripts/check_fake_time_tests.py [WORD ...]   # only the mutations whose name has WORD

Prints one line per mutation (``caught`` with the first failing test, or ``MISSED``) and exits 1
if any was missed. The checkout itself is never written to.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = ["tests/test_deadlines.py", "tests/test_budget_paths.py"]
MUTATIONS = {  # file under src/: [(name, text, its replacement)]
    "plancache/storage/deadline.py": [
        ("give-up at the deadline's last instant", "remaining() <= pause", "remaining() < pause"),
        ("give-up ignores the deadline", "or deadline.remaining() <= pause", "or False"),
        ("Retry-After not a floor", "pause if asked is None else max(pause, asked)", "pause"),
        (
            "backoff not capped",
            "min(BACKOFF_CAP, base * 2 ** (number + 1))",
            "base * 2 ** (number + 1)",
        ),
        (
            "no jitter",
            "random.uniform(0, min(BACKOFF_CAP, base * 2 ** (number + 1)))",
            "min(BACKOFF_CAP, base * 2 ** (number + 1))",
        ),
        ("throttled base not used", "base = THROTTLED_BASE if", "base = BACKOFF_BASE if"),
        (
            "throttled gets no extra tries",
            "        return THROTTLED_ATTEMPTS\n",
            "        return MAX_ATTEMPTS\n",
        ),
        (
            "async pause on the real loop",
            "await deadline.clock.sleep_async(pause)",
            "await asyncio.sleep(pause)",
        ),
        (
            "sync pause on the real clock",
            "deadline.clock.sleep(pause)",
            "__import__('time').sleep(pause)",
        ),
        ("refused retried", "    return not is_refused(exc)\n", "    return True\n"),
        ("4xx retried", "status not in (408, 429):", "status not in (403, 404, 408, 429):"),
        (
            "Retry-After read with isdigit",
            "if _DELTA_SECONDS.fullmatch(text):",
            "if text.isdigit():",
        ),
        (
            "legacy retries get the throttled tries",
            "if not LEGACY_RETRIES and http_status",
            "if http_status",
        ),
        (
            "run_by waits the whole budget",
            "    remaining = deadline.remaining()\n",
            "    remaining = deadline.budget\n",
        ),
        ("run_by starts after the deadline", "    if remaining <= 0:\n", "    if False:\n"),
        (
            "run_by reads the real clock",
            "    remaining = deadline.remaining()\n",
            "    remaining = deadline.at - __import__('time').monotonic()\n",
        ),
    ],
    "plancache/clock.py": [
        (
            "expired leaves the last instant live",
            "return self.remaining() <= 0",
            "return self.remaining() < 0",
        ),
        (
            "within picks the later",
            "return self if self.at <= now + seconds else",
            "return self if self.at >= now + seconds else",
        ),
    ],
    "plancache/storage/store.py": [
        ("store forgets its opening clock", "    store.clock = deadline.clock\n", ""),
        (
            "a spent opening deadline handed on",
            "        if first is not None and not first.expired():\n",
            "        if first is not None:\n",
        ),
        (
            "store defaults on the real clock",
            "        return Deadline.after(self.timeout, self.clock)\n",
            "        return Deadline.after(self.timeout)\n",
        ),
    ],
    "plancache/storage/threads.py": [
        (
            "daemon-thread wait given the whole budget",
            "self._done.wait(max(0.0, deadline.remaining()))",
            "self._done.wait(deadline.budget)",
        ),
    ],
    "plancache/vllm_plugin/prefetch.py": [
        (
            "prefetch wait given the whole budget",
            "self._done.wait(max(0.0, self.deadline.remaining()))",
            "self._done.wait(self.deadline.budget)",
        ),
    ],
    "plancache/storage/local/directory_lock.py": [
        (
            "lock polled on the real clock",
            "            clock.sleep(min(0.05, left))",
            "            __import__('time').sleep(min(0.05, left))",
        ),
        (
            "lock poll overshoots the wait",
            "            clock.sleep(min(0.05, left))",
            "            clock.sleep(0.05)",
        ),
    ],
    "plancache/pipeline/plan_sets/node_plans.py": [
        (
            "node lock without the join grace",
            "deadline.remaining() + JOIN_GRACE + LOCK_MARGIN",
            "deadline.remaining() + LOCK_MARGIN",
        ),
        (
            "node lock polled on the real clock",
            "wait=remaining, clock=deadline.clock)",
            "wait=remaining)",
        ),
    ],
    "plancache/pipeline/plan_sets/set_audit.py": [
        ("set audit reads past the deadline", "    if deadline.expired():", "    if False:"),
        (
            "set audit: a fresh budget per read",
            "        data = read_set(store, name, deadline)",
            "        data = read_set(store, name, None)",
        ),
    ],
}


def run(name: str, path: str, old: str, new: str, work: Path) -> str | None:
    """The first failing test with the mutation in place (None: it passed, the mutation missed)."""
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(REPO / "src", src)
    target = src / path
    text = target.read_text()
    if text.count(old) != 1:
        raise SystemExit(f"{name}: the text to break is not in {path} exactly once")
    target.write_text(text.replace(old, new))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *TESTS],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(src)},
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        return "timed out (a hang, not a failure)"
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
    return (failed[0] if failed else "failed") if done.returncode else None


def main() -> int:
    words = sys.argv[1:]
    missed = 0
    with tempfile.TemporaryDirectory(prefix="plancache-mutants-") as work:
        for path, mutations in MUTATIONS.items():
            for name, old, new in mutations:
                if words and not any(word in name for word in words):
                    continue
                caught = run(name, path, old, new, Path(work))
                missed += caught is None or caught.startswith("timed out")
                verdict = "caught" if caught and not caught.startswith("timed") else "MISSED"
                print(f"{verdict} {name}: {caught}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
