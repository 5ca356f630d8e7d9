"""``plancache completion bash|zsh``: shell completion of commands, options and choices.

Completion is argcomplete's (a maintained library, not a hand-kept script): the shell code it
prints calls ``plancache`` back with ``_ARGCOMPLETE`` set, and :func:`complete` answers from
the same parser the commands use, so a new flag completes the day it ships. argcomplete is the
``[completion]`` extra, imported only here and only in those two cases: a boot-time ``pull``
never pays for it.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..trust.errors import ConfigError

INSTALL_HINT = "shell completion needs argcomplete: pip install 'plancache[completion]'"


def cmd_completion(args: argparse.Namespace) -> int:
    """Print the shell code that completes plancache in ``args.shell``.

    Raises:
        ConfigError: argcomplete is not installed (``config-error``, naming the extra).
    """
    try:
        import argcomplete
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    sys.stdout.write(argcomplete.shellcode(["plancache"], shell=args.shell))
    return 0


def complete(parser: argparse.ArgumentParser) -> None:
    """Answer the shell's completion request and exit, when this run is one (else return)."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    try:
        import argcomplete
    except ImportError:
        return  # no completion: the command line runs as typed
    argcomplete.autocomplete(parser)
