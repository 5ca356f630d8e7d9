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
DEADLINE = "plancache/storage/deadline.py"
MUTATIONS = [  # (name, file under src/, text, its replacement)
    (
        "give-up at the deadline's last instant",
        DEADLINE,
        "remaining() <= pause",
        "remaining() < pause",
    ),
    ("give-up ignores the deadline", DEADLINE, "or deadline.remaining() <= pause", "or False"),
    ("Retry-After not a floor", DEADLINE, "pause if asked is None else max(pause, asked)", "pause"),
    (
        "backoff not capped",
        DEADLINE,
        "min(BACKOFF_CAP, base * 2 ** (number + 1))",
        "base * 2 ** (number + 1)",
    ),
    (
        "no jitter",
        DEADLINE,
        "random.uniform(0, min(BACKOFF_CAP, base * 2 ** (number + 1)))",
        "min(BACKOFF_CAP, base * 2 ** (number + 1))",
    ),
    ("throttled base not used", DEADLINE, "base = THROTTLED_BASE if", "base = BACKOFF_BASE if"),
    (
        "throttled gets no extra tries",
        DEADLINE,
        "        return THROTTLED_ATTEMPTS\n",
        "        return MAX_ATTEMPTS\n",
    ),
    (
        "async pause on the real loop",
        DEADLINE,
        "await deadline.clock.sleep_async(pause)",
        "await asyncio.sleep(pause)",
    ),
    (
        "sync pause on the real clock",
        DEADLINE,
        "deadline.clock.sleep(pause)",
        "__import__('time').sleep(pause)",
    ),
    ("refused retried", DEADLINE, "    return not is_refused(exc)\n", "    return True\n"),
    ("4xx retried", DEADLINE, "status not in (408, 429):", "status not in (403, 404, 408, 429):"),
    (
        "Retry-After read with isdigit",
        DEADLINE,
        "if _DELTA_SECONDS.fullmatch(text):",
        "if text.isdigit():",
    ),
    (
        "legacy retries get the throttled tries",
        DEADLINE,
        "if not LEGACY_RETRIES and http_status",
        "if http_status",
    ),
    (
        "run_by waits the whole budget",
        DEADLINE,
        "    remaining = deadline.remaining()\n",
        "    remaining = deadline.budget\n",
    ),
    ("run_by starts after the deadline", DEADLINE, "    if remaining <= 0:\n", "    if False:\n"),
    (
        "run_by reads the real clock",
        DEADLINE,
        "    remaining = deadline.remaining()\n",
        "    remaining = deadline.at - __import__('time').monotonic()\n",
    ),
    (
        "expired leaves the last instant live",
        "plancache/clock.py",
        "return self.remaining() <= 0",
        "return self.remaining() < 0",
    ),
    (
        "within picks the later",
        "plancache/clock.py",
        "return self if self.at <= now + seconds else",
        "return self if self.at >= now + seconds else",
    ),
    (
        "a spent opening deadline handed on",
        "plancache/storage/store_calls.py",
        "        if first is not None and not first.expired():\n",
        "        if first is not None:\n",
    ),
    (
        "store defaults on the real clock",
        "plancache/storage/store_calls.py",
        "        return Deadline.after(self.timeout, self.clock)\n",
        "        return Deadline.after(self.timeout)\n",
    ),
    (
        "store forgets its opening clock",
        "plancache/storage/store.py",
        "    store.clock = deadline.clock\n",
        "",
    ),
    (
        "daemon-thread wait given the whole budget",
        "plancache/storage/threads.py",
        "self._done.wait(max(0.0, deadline.remaining()))",
        "self._done.wait(deadline.budget)",
    ),
    (
        "prefetch wait given the whole budget",
        "plancache/vllm_plugin/prefetch.py",
        "self._done.wait(max(0.0, self.deadline.remaining()))",
        "self._done.wait(self.deadline.budget)",
    ),
    (
        "lock polled on the real clock",
        "plancache/storage/local/directory_lock.py",
        "            clock.sleep(min(0.05, left))",
        "            __import__('time').sleep(min(0.05, left))",
    ),
    (
        "lock poll overshoots the wait",
        "plancache/storage/local/directory_lock.py",
        "            clock.sleep(min(0.05, left))",
        "            clock.sleep(0.05)",
    ),
    (
        "node lock without the join grace",
        "plancache/pipeline/plan_sets/node_plans.py",
        "deadline.remaining() + JOIN_GRACE + LOCK_MARGIN",
        "deadline.remaining() + LOCK_MARGIN",
    ),
    (
        "node lock polled on the real clock",
        "plancache/pipeline/plan_sets/node_plans.py",
        "wait=remaining, clock=deadline.clock)",
        "wait=remaining)",
    ),
    (
        "set audit reads past the deadline",
        "plancache/pipeline/plan_sets/set_audit.py",
        "    if deadline.expired():",
        "    if False:",
    ),
    (
        "set audit: a fresh budget per read",
        "plancache/pipeline/plan_sets/set_audit.py",
        "        data = read_set(store, name, deadline)",
        "        data = read_set(store, name, None)",
    ),
]


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
        for name, path, old, new in MUTATIONS:
            if words and not any(word in name for word in words):
                continue
            caught = run(name, path, old, new, Path(work))
            missed += caught is None or caught.startswith("timed out")
            verdict = "caught" if caught and not caught.startswith("timed") else "MISSED"
            print(f"{verdict} {name}: {caught}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
