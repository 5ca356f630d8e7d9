"""Terminal output: tables, JSON, a progress bar on TTYs, and one-line errors."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Iterable, Sequence, TextIO


def gib(value: int | None) -> str:
    return "" if value is None else f"{value / 2**30:.2f}"


def print_json(obj: Any, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    json.dump(obj, out, indent=2, sort_keys=True, default=str)
    out.write("\n")


def print_table(rows: Sequence[Sequence[Any]], headers: Sequence[str], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    cells = [list(headers)] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n")


class Progress:
    """A one-line progress bar on stderr, shown only on a terminal and only for long work."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None, min_total: int = 50) -> None:
        self.total = total
        self.label = label
        self.stream = stream or sys.stderr
        self.done = 0
        self.enabled = total >= min_total and self.stream.isatty()
        self._last = 0.0

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = time.monotonic()
        if self.enabled and (now - self._last > 0.1 or self.done >= self.total):
            self._last = now
            width = 30
            filled = int(width * self.done / max(self.total, 1))
            self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()

    def track(self, items: Iterable[Any]) -> Iterable[Any]:
        for item in items:
            yield item
            self.advance()
        self.close()
