"""The three journeys, installed on PATH with the package: ``plancache-ci-bake``,
``plancache-spot-boot``, ``plancache-offline-audit``.

Each journey is a short bash script beside this module (read it: it is the documentation of
its environment variables, and ``--help`` prints that header). The entry points run it with
``PLANCACHE`` defaulting to this interpreter's ``plancache``, so a plain ``pip install`` into
any environment (a venv not on PATH included) has working journeys. ``scripts/*.sh`` in the
repository are thin callers of the same files.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import NoReturn

JOURNEYS = ("ci-bake", "spot-boot", "offline-audit")


def script_path(name: str) -> Path:
    """The packaged script of a journey.

    Raises:
        ValueError: ``name`` is not one of :data:`JOURNEYS`.
    """
    if name not in JOURNEYS:
        raise ValueError(f"no journey {name!r}")
    return Path(__file__).with_name(f"{name}.sh")


def run(name: str, argv: list[str] | None = None) -> NoReturn:
    """Replace this process with the journey's script (bash), exit status and all."""
    bash = shutil.which("bash")
    if bash is None:
        print(f"plancache-{name}: bash is required to run this journey", file=sys.stderr)
        sys.exit(2)
    env = dict(os.environ)
    env.setdefault("PLANCACHE", f"{sys.executable} -m plancache.cli.main")
    args = sys.argv[1:] if argv is None else argv
    os.execve(bash, [bash, str(script_path(name)), *args], env)


def ci_bake() -> NoReturn:
    run("ci-bake")


def spot_boot() -> NoReturn:
    run("spot-boot")


def offline_audit() -> NoReturn:
    run("offline-audit")
