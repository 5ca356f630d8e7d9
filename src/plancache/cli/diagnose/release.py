"""``plancache release``: clear this node's hold-back of a plan (``plan-exceeds-profile``).

A worker holds a verified plan back on its node when a boot that applied it never finished its
start-up and the node's fresh profile came out smaller than the plan by more than the margin
(:mod:`plancache.vllm_plugin.plan_health`). The hold lasts until a different signed plan for
the fingerprint arrives, or until an operator who has looked into it runs this command; the
next boot then applies the plan again (and notes it, so a second crash is caught again).
Also clears a leftover unfinished-boot note of that fingerprint. The notes of a plan directory the
worker could not write are in its state directory (``$PLANCACHE_STATE_DIR``, else
``$VLLM_CACHE_ROOT``, ``/plancache-state/``): run this with the worker's environment.
Exit 0 when every fingerprint named was held back (or ``--all`` found none to clear), 1 when
one was not.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ...storage.local.localdir import default_plan_dir
from ...trust.errors import ConfigError
from ...trust.plans.plan import is_fingerprint
from ...vllm_plugin.plan_health import notes
from ..output import report


def cmd_release(args: argparse.Namespace) -> int:
    """``plancache release``: clear held-back plans (and their boot notes) so the next boot
    that passes the gate applies them again.

    Raises:
        ConfigError: no fingerprint and no ``--all``, or a name that is not a fingerprint
            (``config-error``).
    """
    directory = Path(args.dir) if args.dir else default_plan_dir()
    held = notes.held_fingerprints(directory)
    wanted = held if args.all else list(args.fingerprint)
    bad = [fp for fp in wanted if not is_fingerprint(fp)]
    if bad or (not wanted and not args.all):
        raise ConfigError("name one or more 16-hex-digit fingerprints, or --all")
    released = []
    for fp in wanted:
        if notes.release(directory, fp):
            released.append(fp)
    missing = [fp for fp in wanted if fp not in released]
    if args.json:
        report(args, not missing, directory=str(directory), released=released, not_held=missing)
    else:
        for fp in released:
            print(f"released {fp}: the next boot applies its plan again")
        for fp in missing:
            print(f"{fp} was not held back in {directory}")
    return 1 if missing else 0


def check_held_plans(checks: Any, directory: Path) -> None:
    """doctor: the plans this node holds back, one WARN row (none: no row, as before)."""
    held = notes.held_fingerprints(directory)
    if held:
        checks.add(
            "held-plans",
            "warn",
            f"{len(held)} plan(s) held back on this node (plan-exceeds-profile): "
            f"{', '.join(held[:8])}; `plancache release FINGERPRINT` lets the next boot apply one",
            fingerprints=held,
        )
