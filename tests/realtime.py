"""The ``realtime`` tier's one allowance: how far past a budget a wall-clock bound may end.

A realtime test measures what only real time can show: a black-holed socket given up at the
deadline, a server that trickles, a KMS that hangs, ranks that vote through gloo. The budget
arithmetic, the retries and their pauses are tested on a fake clock (tests/test_deadlines.py), so
what is left to measure here is that a wait *ends*: by its budget, not by an SDK's minutes of
retries (a black-holed endpoint took 423 s with s3fs's defaults). On two shared cores a process
can be kept off its CPU for seconds by the tests beside it, and nothing here schedules around
that; so the allowance is generous, and the tight figures (wall time against budget on a quiet
machine) are measured by ``scripts/bench_budget.py`` instead (BENCHMARKS.md).
"""

from __future__ import annotations

SLACK_S = 5.0
"""Seconds a realtime bound allows past the budget it checks, for a loaded machine."""
