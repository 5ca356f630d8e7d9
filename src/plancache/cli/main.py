"""``plancache`` entry point: parse (:mod:`plancache.cli.parser`), run the command, and the one
place failures become one line (or one JSON report).

Exit codes: 0 success; 1 some plan is invalid, unsigned or was refused; 2 usage or
configuration error (argparse uses 2 as well), or an output that cannot be written; 130
interrupted. With ``--json``, stdout carries exactly one report whatever happens, usage errors
included, unless stdout itself cannot be written (then one line on stderr, exit 2).

A command's module is imported only when it runs (its ``handler``, declared in
:mod:`plancache.cli.parser`): a boot-time ``pull`` pays for what it uses and nothing else.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from ..trust.display import safe_text
from ..trust.errors import PlanCacheError
from .completion import complete
from .flag_objects import apply_keyless_flags
from .parser import Parser, build_parser
from .streams import ClosedPipeSafe, RedactedLines, private_stdout

EXIT_CONFIG = 2

Command = Callable[[argparse.Namespace], int]


def _handler(args: argparse.Namespace) -> Command:
    """The command's function, imported now from its ``handler`` (``"module:function"``)."""
    module, _, name = args.handler.partition(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def _quiet_libraries() -> None:
    """SDK loggers (gcsfs logs each retry with a traceback) stay silent: plancache reports the
    failure itself, in one line. PLANCACHE_DEBUG=1 lets them speak."""
    import logging

    if not os.environ.get("PLANCACHE_DEBUG"):
        logging.getLogger().addHandler(logging.NullHandler())
        for name in ("gcsfs", "s3fs", "fsspec", "aiobotocore", "botocore"):
            logging.getLogger(name).propagate = False


def _json_wanted(argv: Sequence[str]) -> bool:
    head = list(argv[: list(argv).index("--")]) if "--" in argv else list(argv)
    return "--json" in head


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. stdout survives a reader that went away (the exit code stays the
    verdict); every line on stderr is redacted (no credential from a URL or key reference,
    whoever wrote the line: argparse, an SDK's message, a summary)."""
    stdout, stderr = sys.stdout, sys.stderr
    own = (
        private_stdout(stdout, stderr) if argv is None else stdout
    )  # the process's CLI: native writes to stderr
    out = sys.stdout = ClosedPipeSafe(own)
    sys.stderr = RedactedLines(stderr)
    try:
        code = _main(argv)
        out.flush()
        return _output_written(out, code)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            if argv is not None:  # a caller's own streams back; the process's CLI keeps them to
                sys.stdout, sys.stderr = stdout, stderr  # its end (asyncio reports late, at exit)
            else:
                _leave_the_heap_to_the_exit()


def _output_written(out: ClosedPipeSafe, code: int) -> int:
    """``code``, unless stdout could not be written (a full disk or quota under ``>
    report.json``, EIO): the report is missing or cut short, so one line says so and the exit
    is 2. Exit 1 (what an uncaught error gave) would blame the plans for a local failure, and 0
    would vouch for a report that is not there. A reader that went away is not a failure."""
    if out.failure is None or code == 130:
        return code
    reason = out.failure.strerror or type(out.failure).__name__
    print(f"plancache: error: cannot write the output: {safe_text(reason, 200)}", file=sys.stderr)
    return EXIT_CONFIG


def _leave_the_heap_to_the_exit() -> None:
    """The process ends next: the cyclic collector's full passes over the whole heap at
    interpreter shutdown (CPython runs them whether collection is enabled or not) would only
    free what the exit frees anyway. Once botocore has loaded its service models they cost
    ~0.1 s, more than a boot-time ``pull`` of one plan spends on its own work (BENCHMARKS.md,
    issue 50 item 7 (c)). ``gc.freeze`` puts every object out of their reach; everything else
    the exit does still happens: atexit handlers (thread pools joined, logging flushed,
    temporary files removed), the streams' flush, objects freed as their last reference goes.
    Only for the process's own CLI (``argv`` None): a caller's process keeps its collector."""
    import gc

    gc.freeze()


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """argparse, where whatever an argument type raises is a usage error too (one line, and
    one JSON report with ``--json``): a RecursionError from 1,000 brackets included."""
    try:
        return parser.parse_args(argv)
    except SystemExit:
        raise
    except Exception as exc:
        parser.error(f"invalid argument ({type(exc).__name__}: {safe_text(exc, 120)})")


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    complete(
        parser
    )  # the shell asking for completions (plancache completion bash|zsh): answers and exits
    if not argv:
        parser.print_help()
        return 0
    Parser.json_requested = _json_wanted(argv)
    args = _parse(parser, argv)
    json_out = bool(getattr(args, "json", False))
    if args.debug:
        os.environ["PLANCACHE_DEBUG"] = "1"
    apply_keyless_flags(args)
    _quiet_libraries()

    def fail(reason: str, detail: str, label: str = "error") -> None:
        print(f"plancache: {label}: {detail}", file=sys.stderr)
        if json_out:
            from .output import report

            report(args, False, error=(reason, detail))

    from ..storage.oci.mirrors import mirror_reads

    mirror_reads.forget()
    try:
        return _handler(args)(args)
    except PlanCacheError as exc:
        fail(exc.reason.value, safe_text(exc.detail, 500))
        return EXIT_CONFIG
    except KeyboardInterrupt:
        fail("interrupted", "interrupted", "interrupted")
        return 130
    except ModuleNotFoundError as exc:
        extra = missing_extra(exc.name or "")
        if extra is None:
            return _internal(exc, fail)
        fail("config-error", f"{exc.name} is not installed: pip install 'plancache[{extra}]'")
        return EXIT_CONFIG
    except Exception as exc:  # a bug, not a user mistake: one line, the traceback on request
        return _internal(exc, fail)
    finally:  # where the bytes came from, success or not (docs/stores.md, "Mirrors")
        for host, configured_in in mirror_reads.mirrors_read():
            print(
                f"plancache: read via mirror {host} (configured in {configured_in})",
                file=sys.stderr,
            )


OPTIONAL_EXTRAS = {
    "PyKCS11": "pkcs11",
    "s3fs": "s3",
    "aiobotocore": "s3",
    "botocore": "s3",
    "boto3": "s3",
    "gcsfs": "gcs",
    "google.cloud.storage": "gcs",
    "google.cloud.kms": "gcpkms",
    "google.cloud.kms_v1": "gcpkms",
    "adlfs": "azure",
    "azure": "azure",
    "aiohttp": "oci",
    "sigstore": "sigstore",
    "argcomplete": "completion",
    "vllm": "vllm",
    "torch": "vllm",
}
"""Each optional dependency, by the module a missing one is reported as, and the extra that
installs it (pyproject.toml). boto3 is in ``[s3]`` and ``[awskms]``; ``[s3]`` is named."""


def missing_extra(module: str) -> str | None:
    """The extra that installs ``module`` (or the package it belongs to), or None."""
    parts = module.split(".")
    for length in range(len(parts), 0, -1):
        extra = OPTIONAL_EXTRAS.get(".".join(parts[:length]))
        if extra is not None:
            return extra
    return None


def _internal(exc: BaseException, fail: Callable[..., None]) -> int:
    """A bug, not a user mistake: one line, the traceback on request."""
    if os.environ.get("PLANCACHE_DEBUG"):
        import traceback

        traceback.print_exception(exc)
    fail(
        "internal-error",
        f"{type(exc).__name__}: {safe_text(exc, 300)} (PLANCACHE_DEBUG=1 shows more)",
        "internal error",
    )
    return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
