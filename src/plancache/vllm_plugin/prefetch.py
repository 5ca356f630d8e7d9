"""A store fetch running in a background thread while vLLM loads the weights.

The worker's critical path then only waits for what is left of the budget: with weights
taking seconds, the store client's import (s3fs alone ≈ 0.5 s), the round trip, the
verification and the local write are all done by the time ``determine_available_memory``
asks for the plan.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Prefetch(Generic[T]):
    """Runs ``task`` once in a daemon thread; :meth:`result` waits until a monotonic deadline."""

    def __init__(self, key: str, deadline: float, task: Callable[[], T]) -> None:
        self.key = key
        self.deadline = deadline
        self.started = time.monotonic()
        self.finished: float | None = None
        self._task = task
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"plancache-prefetch-{key}", daemon=True)

    def start(self) -> "Prefetch[T]":
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self._value = self._task()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            self._error = exc
        finally:
            self.finished = time.monotonic()
            self._done.set()

    def result(self) -> tuple[bool, T | None]:
        """(finished?, value), waiting at most until the task's deadline."""
        if not self._done.wait(max(0.0, self.deadline - time.monotonic())):
            return False, None
        if self._error is not None:
            raise self._error
        return True, self._value
