"""Terminal output: tables, JSON, a progress bar on TTYs, and one-line errors."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Sequence, TextIO

from ..trust.display import safe_text


CELL_LIMIT = 300
"""Characters per table cell: a detail is one line; a hostile value cannot flood a terminal."""


def gib(value: int | None) -> str:
    return "" if value is None else f"{value / 2**30:.2f}"


def print_json(obj: Any, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    json.dump(obj, out, indent=2, sort_keys=True, default=str)
    out.write("\n")


def print_table(rows: Sequence[Sequence[Any]], headers: Sequence[str], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    cells = [list(headers)] + [["" if c is None else safe_text(c, CELL_LIMIT) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n")


class Progress:
    """A one-line progress counter on stderr, shown only on a terminal and only for long work.

    ``total`` may be unknown (0) when the work is counted while it is listed.
    """

    def __init__(self, label: str, total: int = 0, stream: TextIO | None = None, min_shown: int = 50) -> None:
        self.total = total
        self.label = label
        self.stream = stream or sys.stderr
        self.done = 0
        self.min_shown = min_shown
        self.tty = self.stream.isatty()
        self.shown = False
        self._last = 0.0

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = time.monotonic()
        if not self.tty or self.done < self.min_shown or now - self._last < 0.1:
            return
        self._last = now
        self.shown = True
        if self.total:
            width = 30
            filled = int(width * min(self.done, self.total) / self.total)
            text = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
        else:
            text = f"{self.done}"
        self.stream.write(f"\r{self.label} {text}")
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
