"""Terminal output: the one JSON report, tables, and progress on terminals.

Every ``--json`` run prints exactly one document on stdout, success or failure, with the
shared top level of ``report.schema.json``: ``schema``, ``command``, ``ok`` and, when the
command failed as a whole, ``error: {reason, detail}``. Times are RFC 3339 UTC with ``Z``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from itertools import repeat
from typing import Any, TextIO

from ..trust.display import is_plain, redact, safe_text

SCHEMA = "plancache.report/v1"
"""The report's versioned name; ``report.schema.json`` beside this module describes it."""

CELL_LIMIT = 300
"""Characters per table cell: a detail is one line; a hostile value cannot flood a terminal."""


def gib(value: int | None) -> str:
    return "" if value is None else f"{value / 2**30:.2f}"


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return redact(str(value))


def _redacted(value: Any) -> Any:
    """Every string in a report, keys aside, through :func:`redact`: a location, URL, key
    reference or error detail never prints a credential (``url``, ``location``,
    ``error.detail``, a plan's ``detail``, doctor's ``data``)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redacted(v) for v in value]
    return value


def render_json(obj: Any) -> str:
    """A report as the text printed on stdout and written by ``--report``: redacted, one
    document."""
    return json.dumps(_redacted(obj), indent=2, sort_keys=True, default=_json_default) + "\n"


def print_json(obj: Any, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    out.write(render_json(obj))
    out.flush()


def document(
    command: str | None,
    ok: bool,
    *,
    body: dict[str, Any] | None = None,
    error: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """The report: shared top level first, the command's own keys beside it, and the mirrors
    read through, if any (``via_mirror``: the bytes did not come from the URL's registry)."""
    from ..storage.oci.mirrors.mirror_reads import mirrors_read

    doc: dict[str, Any] = {"schema": SCHEMA, "command": command or "", "ok": ok, **(body or {})}
    via = mirrors_read()
    if via:
        doc["via_mirror"] = [{"host": h, "configured_in": c} for h, c in via]
    if error is not None:
        doc["error"] = {"reason": error[0], "detail": error[1]}
    return doc


def report(
    args: argparse.Namespace, ok: bool, error: tuple[str, str] | None = None, **body: Any
) -> None:
    """Print the command's report (``args.command`` names the command)."""
    print_json(document(getattr(args, "command", None), ok, body=body, error=error))


def print_table(
    rows: Sequence[Sequence[Any]], headers: Sequence[str], out: TextIO | None = None
) -> None:
    """Rows as aligned columns, every cell escaped (:func:`safe_text`). Column by column: each
    distinct text of a column is escaped once (a 10,000-plan ``verify`` repeats its signer,
    status and reason in every row), and padding and joining run in C; cell by cell, the
    table was ~35 ms of that command's serial tail."""
    out = out or sys.stdout
    cells = zip(*rows, strict=True) if rows else ([] for _ in headers)  # no rows: headers alone
    columns = [[header, *_escaped(column)] for header, column in zip(headers, cells, strict=True)]
    padded = [list(map(str.ljust, column, repeat(max(map(len, column))))) for column in columns]
    out.write("".join(["  ".join(line).rstrip() + "\n" for line in zip(*padded, strict=True)]))


def _escaped(column: Sequence[Any]) -> list[str]:
    """A column's cells, escaped: text through one escape per distinct string; anything else
    (None is empty) each on its own, so that equal values of other types (``True``, ``1``)
    still print apart."""
    if set(map(type, column)) == {str}:
        distinct = list(dict.fromkeys(column))
        if max(map(len, distinct)) <= CELL_LIMIT and is_plain(" ".join(distinct)):
            return list(column)  # a column of fingerprints: 10,000 texts, one check
        escaped = {text: safe_text(text, CELL_LIMIT) for text in distinct}
        return list(map(escaped.__getitem__, column))
    return ["" if value is None else safe_text(value, CELL_LIMIT) for value in column]


def status_text(status: str, reason: str) -> str:
    """``invalid (digest-mismatch)``, but ``unsigned``, not ``unsigned (unsigned)``."""
    return status if reason in ("ok", "", status, "no-trusted-keys") else f"{status} ({reason})"


class Progress:
    """Progress of long work on stderr, counted in plans, with rate and ETA (tqdm).

    Shown only on a terminal, unless ``quiet``; tqdm is imported only then. Implements the
    library's ``Tally`` (``start(total)``, ``advance(count)``).
    """

    def __init__(self, label: str, quiet: bool = False, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = not quiet and self.stream.isatty()
        self._bar: Any = None

    def start(self, total: int) -> None:
        if not self.enabled or self._bar is not None:
            return
        from tqdm import tqdm

        self._bar = tqdm(
            total=total or None,
            desc=self.label,
            unit="plan",
            file=self.stream,
            leave=False,
            mininterval=0.2,
            delay=0.5,
            dynamic_ncols=True,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total_fmt} plans "
            "[{elapsed}<{remaining}, {rate_fmt}]",
        )

    def advance(self, count: float = 1) -> None:
        if self._bar is None:
            self.start(0)
        if self._bar is not None:
            self._bar.update(count)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
