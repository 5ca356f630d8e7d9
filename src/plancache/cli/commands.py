"""Every built-in subcommand, in the order ``plancache --help`` lists them, and where its code
lives.

Declarations only: a command's module is imported when that command runs (``handler`` is
``"module:function"`` under :mod:`plancache.cli`), so ``plancache pull`` does not import what
``verify``, ``push`` or ``demo`` need (process pools, signing, temp dirs). The flags of each
family of commands are in :mod:`plancache.cli.flags`; ``demo`` and ``completion``, a few flags
each, are here. Keep these modules' imports to argparse and the light argument types.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .flags.audit_flags import add_audit_commands
from .flags.compile_cache_flags import add_compile_cache_commands
from .flags.diagnose_flags import add_doctor, add_explain, add_fingerprint, add_release
from .flags.shared_flags import add_command
from .flags.signing_flags import add_signing_commands
from .flags.store_flags import add_store_commands

if TYPE_CHECKING:
    from .flags.shared_flags import Sub


def add_parsers(sub: Sub) -> None:
    add_signing_commands(sub)
    add_audit_commands(sub)
    add_store_commands(sub)
    add_doctor(sub)
    add_release(sub)
    p = add_command(
        sub,
        "demo",
        "demo:run",
        "run the whole story in temporary directories",
        "CI bake (plans written as vLLM writes them, signed, pushed) -> a tampered plan in the "
        "store -> spot boot pull (verified) -> the gate's decision at two free-memory values. "
        "Touches nothing outside a temp dir, except the store given with --store.",
    )
    p.add_argument(
        "--store",
        metavar="URL",
        help="use this store instead of an embedded file:// one (the demo writes and then deletes "
        "two plans under it)",
    )
    p.add_argument(
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        default=[],
        help="storage option for --store (repeatable)",
    )
    p = add_command(
        sub,
        "completion",
        "completion:cmd_completion",
        "print shell completion code for bash or zsh",
        "Print the code that makes bash or zsh complete plancache's commands, options and choices "
        "(argcomplete; pip install 'plancache[completion]'). Load it from your shell's rc file:\n"
        '  bash: eval "$(plancache completion bash)"\n  zsh:  eval "$(plancache completion zsh)"',
    )
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("shell", choices=("bash", "zsh"), metavar="SHELL", help="bash or zsh")
    add_fingerprint(sub)
    add_explain(sub)
    add_compile_cache_commands(sub)
