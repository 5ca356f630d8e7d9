"""pytest-xdist's ``--dist loadfile`` with the extra workers held back until vLLM's fixtures are
done.

Why: on a 2-core machine the files that boot vLLM (:data:`conftest.VLLM_FILES`) keep both
cores busy for their first minutes. A third worker started beside them only slows them down by as
much as it gains (measured, docs/test-suite.md: 13 min 33 s against 13 min 05 s). After them, the
rest of the suite mostly waits on servers, black holes and budgets, and two workers leave the cores
25-50 % idle: that is where a third worker helps. So workers past the first ``base`` take no file
until every heavy file has finished; until then they only wait, having collected the suite.

And no more than ``base`` deadline files (``deadline``: tests that assert a wall-time bound) run at
once, on any workers: three of them side by side in a CPU-bound tail starved their servers and
budgets (a plan-set read past its 2 s budget, a KMS sign; measured, docs/test-suite.md). A worker
whose next file would be a third takes the first other file in the queue instead, and waits only
when every file left is a deadline file: so the deadline files can be queued early and run two at
a time beside the quick files, instead of making a tail of their own on two workers after every
other file (2026-12-05: the last 95 s of a run, the cores 58-70 % busy).
"""

from __future__ import annotations

import os
from typing import Any

from xdist.scheduler import LoadFileScheduling


class HeldBackLoadFile(LoadFileScheduling):
    """``--dist loadfile`` (a file's tests on one worker, the files in the queue's order), except
    that only the ``base`` lowest-numbered workers are handed files while a file named in ``heavy``
    is queued or still running. Every other rule is xdist's own: with no heavy file in the run,
    every worker starts at once."""

    def __init__(
        self,
        config: Any,
        log: Any,
        *,
        base: int,
        heavy: frozenset[str],
        deadline: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__(config, log)
        self.base = base
        self.heavy = heavy
        self.deadline = deadline
        self.waiting: set[Any] = set()
        """Workers that asked for a file and were held: each test's end looks at them again."""

    def _unfinished(self, names: frozenset[str], work: dict[str, dict[str, bool]]) -> bool:
        return any(
            os.path.basename(scope) in names and not all(done.values())
            for scope, done in work.items()
        )

    def _pick(self, node: Any) -> str | None:
        """The file ``node`` takes now: the first in the queue that it may take, or None (it waits).
        It waits while it is not one of the ``base`` lowest-numbered live workers and a heavy
        file is queued or unfinished (live, so that a worker that replaces a crashed one, or a held
        one moving up, keeps ``base`` working). A deadline file it may take while fewer than
        ``base`` *other* workers have one unfinished. Other: a worker's own file never counts
        (xdist keeps a worker's last test back until it is sent more, so counting it would wait
        for itself). That the deadline files never run beside the heavy ones is the queue's order
        (tests/conftest.py): a deadline file is never taken before the files queued ahead of it."""
        working = sorted(self.nodes, key=_number)[: self.base]
        if node not in working and (
            self._unfinished(self.heavy, self.workqueue)
            or any(self._unfinished(self.heavy, work) for work in self.assigned_work.values())
        ):
            return None
        full = (
            sum(
                self._unfinished(self.deadline, work)
                for other, work in self.assigned_work.items()
                if other is not node
            )
            >= self.base
        )
        return next(
            (
                scope
                for scope in self.workqueue
                if not (full and os.path.basename(scope) in self.deadline)
            ),
            None,
        )

    def _assign_work_unit(self, node: Any) -> None:
        scope = self._pick(node)
        if scope is None:
            self.waiting.add(node)
            return
        self.waiting.discard(node)
        self.workqueue.move_to_end(scope, last=False)  # xdist's assigns the queue's first file
        super()._assign_work_unit(node)

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        """xdist's, then a held worker gets a file if it may now (or is shut down when none is
        left)."""
        super().mark_test_complete(node, item_index, duration)
        for other in list(self.waiting):
            if other is not node and (not self.workqueue or self._pick(other) is not None):
                self.waiting.discard(other)
                self._reschedule(other)


def _number(node: Any) -> int:
    number = node.gateway.id.removeprefix("gw")  # xdist names its workers gw0, gw1, ...
    return int(number) if number.isdigit() else 1 << 30
