"""The CLI's two output streams, made to keep their promises whatever code writes to them.

- :class:`ClosedPipeSafe` (stdout): the exit code is the verdict. A reader that goes away
  (``plancache verify | head``) used to end the command with ``BrokenPipeError`` and exit 0,
  turning a failed audit into a success. Now fd 1 becomes ``/dev/null`` at the first broken
  write and the command runs to its own exit code; stderr still speaks. Any other failed write
  (a full disk or quota under ``> report.json``, EIO) is kept in :attr:`ClosedPipeSafe.failure`
  and silences the stream the same way: the output is lost, so the CLI ends with one line and
  exit 2 instead of a traceback and exit 1, which would blame the plans.
- :class:`RedactedLines` (stderr): no secret in any output. Lines reach stderr from argparse
  (which echoes argument values), from SDK messages inside error details and from summaries
  naming the store; each complete line goes through :func:`plancache.trust.display.redact`
  before it is written. stdout's JSON report is redacted field by field instead
  (:func:`plancache.cli.output.print_json`), so its keys and syntax are never touched.
- :func:`private_stdout`: only plancache writes to stdout; a native library's diagnostics on
  fd 1 go to stderr instead of before the JSON report.
"""

from __future__ import annotations

import io
import os
from typing import TextIO

from ..trust.display import redact


def private_stdout(stdout: TextIO, stderr: TextIO) -> TextIO:
    """A copy of stdout for the CLI's own output, with fd 1 itself pointed at stderr.

    Why: native libraries write to fd 1 behind Python's back (PyKCS11's C layer prints
    ``SYS_dyn_LoadLibrary() …: cannot open shared object file`` there), and stdout must hold
    nothing but the report. Only for the CLI's own process; on any failure stdout is kept."""
    try:
        stdout.flush()
        fd = os.dup(stdout.fileno())
        os.dup2(stderr.fileno(), stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return stdout
    return io.TextIOWrapper(
        io.FileIO(fd, "w"),
        encoding=stdout.encoding,
        errors=stdout.errors,
        line_buffering=getattr(stdout, "line_buffering", False),
    )


class ClosedPipeSafe(io.TextIOBase):
    """A text stream whose closed reader silences it instead of raising; so does any other
    failed write, remembered in :attr:`failure` for the caller to report."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner
        self.failure: OSError | None = None
        """The first write or flush that failed other than on a closed reader: what was written
        is incomplete, and the command must not exit as if its output were there."""

    def _closed(self) -> None:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.inner.fileno())
            os.close(devnull)
        except (OSError, ValueError, io.UnsupportedOperation):
            # Not a real fd (a capture): drop what follows.
            self.inner = open(os.devnull, "w")  # noqa: SIM115 - kept open: every later write goes there

    def _failed(self, exc: OSError) -> None:
        if self.failure is None:
            self.failure = exc
        self._closed()

    def write(self, text: str) -> int:
        try:
            return self.inner.write(text)
        except BrokenPipeError:
            self._closed()
        except OSError as exc:
            self._failed(exc)
        return len(text)

    def flush(self) -> None:
        try:
            self.inner.flush()
        except BrokenPipeError:
            self._closed()
        except OSError as exc:
            self._failed(exc)
            self._flush_silenced()

    def _flush_silenced(self) -> None:
        """What the failed flush left in the buffer goes where the stream now writes (nowhere),
        so that the exit's own flush does not meet the same error again."""
        try:
            self.inner.flush()
        except OSError:
            pass

    def isatty(self) -> bool:
        return self.inner.isatty()

    def fileno(self) -> int:
        return self.inner.fileno()


class RedactedLines(ClosedPipeSafe):
    """Writes whole lines, each redacted; a partial line waits for its end (or a flush). A
    carriage return ends a line too, so a progress bar still redraws in place."""

    def __init__(self, inner: TextIO) -> None:
        super().__init__(inner)
        self.pending = ""

    def write(self, text: str) -> int:
        self.pending += text
        cut = max(self.pending.rfind("\n"), self.pending.rfind("\r"))
        if cut >= 0:
            done, self.pending = self.pending[: cut + 1], self.pending[cut + 1 :]
            super().write(redact(done))
        return len(text)

    def flush(self) -> None:
        if self.pending:
            done, self.pending = self.pending, ""
            super().write(redact(done))
        super().flush()
